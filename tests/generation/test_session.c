/* Sessions on a real (small, random) model: KV-cached decode equals full recomputation,
 * truncating and re-decoding equals never having decoded, bad token ids and context overflow
 * are refused, the sampler is reproducible and honours its filters, and the generation loop
 * feeds the penalties the whole context, hands out each token's logits row and says why it
 * stopped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

static const char *model_dir = RLX_TEST_DATA "/dense-tied-f32-s1";

static rlx_model *model;
static rlx_backend *backend;
static rlx_plugin_handle *plugin;
static int64_t vocab;

static rlx_session *new_session(uint32_t capacity) {
    const rlx_model_config *c = rlx_model_config_of(model);
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1};
    rlx_session_options o = {
        .size = sizeof(rlx_session_options), .kv_capacity = capacity, .backends = &backend, .n_backends = 1};
    rlx_session *s;
    assert_ok(rlx_session_create(model, &spec, &o, &s));
    return s;
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

static const int32_t prompt[] = {17, 3, 250, 99, 4, 301, 77, 12};
#define N_PROMPT (uint32_t)(sizeof prompt / sizeof prompt[0])

static void test_cached_decode_equals_recomputation(void **state) {
    (void)state;
    rlx_session *full = new_session(64), *step = new_session(64);
    const float *all, *row;
    assert_ok(rlx_session_forward(full, prompt, N_PROMPT, 1, &all));
    float *expect = malloc((size_t)(N_PROMPT * vocab) * sizeof *expect);
    memcpy(expect, all, (size_t)(N_PROMPT * vocab) * sizeof *expect);
    /* a 3-token prefill, then one token at a time, then a 2-token step */
    assert_ok(rlx_session_forward(step, prompt, 3, 1, &row));
    assert_true(max_diff(row, expect, 3 * vocab) < 1e-4);
    for (uint32_t i = 3; i < N_PROMPT - 2; i++) {
        assert_ok(rlx_session_forward(step, &prompt[i], 1, 0, &row));
        assert_true(max_diff(row, expect + i * vocab, vocab) < 1e-4);
    }
    assert_ok(rlx_session_forward(step, &prompt[N_PROMPT - 2], 2, 0, &row));
    assert_true(max_diff(row, expect + (N_PROMPT - 1) * vocab, vocab) < 1e-4);
    assert_int_equal(rlx_session_length(step), N_PROMPT);
    free(expect);
    rlx_session_destroy(full);
    rlx_session_destroy(step);
}

static void test_truncate_then_decode_equals_never_decoded(void **state) {
    (void)state;
    rlx_session *a = new_session(64), *b = new_session(64);
    const float *la, *lb;
    const int32_t rejected[] = {5, 6, 7}, accepted[] = {200, 201};
    assert_ok(rlx_session_forward(a, prompt, N_PROMPT, 0, &la));
    assert_ok(rlx_session_forward(a, rejected, 3, 1, &la));
    assert_ok(rlx_session_truncate(a, N_PROMPT));
    assert_int_equal(rlx_session_length(a), N_PROMPT);
    assert_ok(rlx_session_forward(a, accepted, 2, 1, &la));
    assert_ok(rlx_session_forward(b, prompt, N_PROMPT, 0, &lb));
    assert_ok(rlx_session_forward(b, accepted, 2, 1, &lb));
    assert_true(max_diff(la, lb, 2 * vocab) == 0); /* same kernels, same inputs: bit-identical */
    assert_int_equal(rlx_session_truncate(a, 100), RLX_E_RANGE);
    /* back into the prompt, before the last forward of several positions began (a recurrent
     * state is then rebuilt from position 0): as a session that never went further */
    rlx_session *c = new_session(64);
    const float *lc;
    assert_ok(rlx_session_truncate(a, 5));
    assert_ok(rlx_session_forward(a, accepted, 2, 1, &la));
    assert_ok(rlx_session_forward(c, prompt, 5, 0, &lc));
    assert_ok(rlx_session_forward(c, accepted, 2, 1, &lc));
    assert_true(max_diff(la, lc, 2 * vocab) == 0);
    rlx_session_destroy(a);
    rlx_session_destroy(b);
    rlx_session_destroy(c);
}

/* A speculative round: a verification of 4 positions, cut back to the 2 accepted. A hybrid's
 * session takes the kept row's recurrent state from the state rows the verification wrote, so
 * nothing runs again (rlx_session_replayed_positions), and the next tokens' logits are those of a
 * session that only ever saw the accepted tokens. Cut back to the verification's start, the
 * state is rebuilt by running positions again, with the same result. */
static void test_truncate_into_a_verification(void **state) {
    (void)state;
    const int hybrid =
        rlx_model_config_of(model)->model_type[0] && strncmp(rlx_model_config_of(model)->model_type, "qwen3_5", 7) == 0;
    rlx_session *a = new_session(64), *b = new_session(64);
    const float *la, *lb;
    const int32_t draft[] = {5, 6, 7, 8}, next[] = {200, 201, 202}, more[] = {9};
    assert_ok(rlx_session_forward(a, prompt, N_PROMPT, 0, &la));
    const uint64_t replayed = rlx_session_replayed_positions(a);
    assert_ok(rlx_session_forward(a, draft, 4, 1, &la));
    assert_ok(rlx_session_truncate(a, N_PROMPT + 2));
    assert_ok(rlx_session_forward(a, next, 3, 1, &la));
    assert_ok(rlx_session_truncate(a, N_PROMPT + 3)); /* keep 200 of the second round */
    assert_ok(rlx_session_forward(a, more, 1, 1, &la));
    assert_int_equal(rlx_session_replayed_positions(a), replayed);
    const int32_t seen[] = {5, 6, 200, 9};
    assert_ok(rlx_session_forward(b, prompt, N_PROMPT, 0, &lb));
    for (uint32_t i = 0; i < 4; i++)
        assert_ok(rlx_session_forward(b, &seen[i], 1, 1, &lb));
    assert_true(max_diff(la, lb, vocab) < 1e-4);
    /* all of the next verification rejected, the bonus token too: back to its first position */
    assert_ok(rlx_session_forward(a, draft, 3, 1, &la));
    assert_ok(rlx_session_truncate(a, N_PROMPT + 4));
    assert_ok(rlx_session_forward(a, more, 1, 1, &la));
    assert_ok(rlx_session_forward(b, more, 1, 1, &lb));
    assert_true(max_diff(la, lb, vocab) < 1e-4);
    if (hybrid)
        assert_true(rlx_session_replayed_positions(a) > replayed);
    rlx_session_destroy(a);
    rlx_session_destroy(b);
}

/* A draft model's rounds: tokens proposed one at a time, the rejected ones cut off. After the
 * first such cut a hybrid's session keeps each one-position state, so later cuts run nothing
 * again; the logits stay those of a session that only saw the kept tokens. */
static void test_truncate_after_single_steps(void **state) {
    (void)state;
    rlx_session *a = new_session(64), *b = new_session(64);
    const float *la, *lb;
    assert_ok(rlx_session_forward(a, prompt, N_PROMPT, 0, &la));
    assert_ok(rlx_session_forward(b, prompt, N_PROMPT, 0, &lb));
    const int32_t proposed[3][3] = {{5, 6, 7}, {40, 41, 42}, {60, 61, 62}};
    const uint32_t kept[3] = {1, 2, 0};
    uint64_t after_first = 0;
    for (uint32_t round = 0; round < 3; round++) {
        const uint32_t start = rlx_session_length(a);
        for (uint32_t i = 0; i < 3; i++)
            assert_ok(rlx_session_forward(a, &proposed[round][i], 1, 1, &la));
        assert_ok(rlx_session_truncate(a, start + kept[round]));
        const int32_t correction = 100 + (int32_t)round;
        assert_ok(rlx_session_forward(a, &correction, 1, 1, &la));
        for (uint32_t i = 0; i < kept[round]; i++)
            assert_ok(rlx_session_forward(b, &proposed[round][i], 1, 1, &lb));
        assert_ok(rlx_session_forward(b, &correction, 1, 1, &lb));
        assert_true(max_diff(la, lb, vocab) < 1e-4);
        if (round == 0)
            after_first = rlx_session_replayed_positions(a);
    }
    assert_int_equal(rlx_session_replayed_positions(a), after_first);
    rlx_session_destroy(a);
    rlx_session_destroy(b);
}

static void test_bad_tokens_and_overflow_are_refused(void **state) {
    (void)state;
    rlx_session *s = new_session(8);
    const float *out;
    int32_t bad[2] = {1, (int32_t)vocab};
    assert_int_equal(rlx_session_forward(s, bad, 2, 0, &out), RLX_E_RANGE);
    assert_error_mentions("outside the vocabulary");
    assert_int_equal(rlx_session_length(s), 0);
    assert_int_equal(rlx_session_forward(s, prompt, N_PROMPT, 0, &out), RLX_OK);
    assert_int_equal(rlx_session_forward(s, prompt, 1, 0, &out), RLX_E_RANGE);
    assert_error_mentions("exceed the context of 8");
    rlx_session_destroy(s);
}

static void test_generate_stops_at_limit_and_is_greedy(void **state) {
    (void)state;
    rlx_session *s = new_session(64), *check = new_session(64);
    rlx_sampler_params sp = rlx_sampler_params_default();
    sp.greedy = 1;
    rlx_sampler *greedy;
    assert_ok(rlx_sampler_create(&sp, vocab, &greedy));
    rlx_gen_stats st;
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    assert_ok(rlx_generate(&lm, greedy, prompt, N_PROMPT, 4, NULL, NULL, &st));
    assert_int_equal(st.n_prompt, N_PROMPT);
    assert_true(st.n_generated >= 1 && st.n_generated <= 4);
    assert_int_equal(rlx_session_length(s), N_PROMPT + st.n_generated - 1);
    /* the first generated token is the argmax of the prompt's last logits */
    const float *l;
    assert_ok(rlx_session_forward(check, prompt, N_PROMPT, 0, &l));
    int32_t best = 0;
    for (int64_t v = 1; v < vocab; v++)
        best = l[v] > l[best] ? (int32_t)v : best;
    assert_int_equal(rlx_sampler_sample(greedy, l), best);
    rlx_sampler_destroy(greedy);
    rlx_session_destroy(s);
    rlx_session_destroy(check);
}

/* A request beyond the room ends at the full context without an error: the token sampled from
 * the last position is reported, not fed. */
static void test_generate_stops_at_a_full_context(void **state) {
    (void)state;
    const uint32_t capacity = N_PROMPT + 4;
    rlx_session *s = new_session(capacity);
    rlx_sampler_params sp = rlx_sampler_params_default();
    sp.greedy = 1;
    rlx_sampler *greedy;
    assert_ok(rlx_sampler_create(&sp, vocab, &greedy));
    rlx_gen_stats st;
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    assert_ok(rlx_generate(&lm, greedy, prompt, N_PROMPT, 1000, NULL, NULL, &st));
    assert_int_equal(st.stop, RLX_GEN_STOP_CONTEXT);
    assert_int_equal(st.n_generated, capacity - N_PROMPT + 1);
    assert_int_equal(rlx_session_length(s), capacity);
    rlx_sampler_destroy(greedy);
    rlx_session_destroy(s);
}

static void test_sampler_reproducible_and_filtered(void **state) {
    (void)state;
    enum { V = 50, DRAWS = 2000 };
    float logits[V], probs[V];
    for (int i = 0; i < V; i++)
        logits[i] = (float)((i * 37) % V) / 10.0f;
    rlx_sampler_params p = rlx_sampler_params_default();
    p.seed = 42;
    rlx_sampler *a, *b;
    assert_ok(rlx_sampler_create(&p, V, &a));
    assert_ok(rlx_sampler_create(&p, V, &b));
    int differ = 0, counts[V] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t x = rlx_sampler_sample(a, logits), y = rlx_sampler_sample(b, logits);
        assert_int_equal(x, y);
        counts[x]++;
    }
    rlx_sampler_probs(a, logits, probs);
    double total = 0;
    for (int i = 0; i < V; i++) {
        total += probs[i];
        /* empirical frequency within 5 standard deviations of the softmax probability */
        double sd = sqrt(probs[i] * (1 - probs[i]) / DRAWS);
        differ += fabs(counts[i] / (double)DRAWS - probs[i]) > 5 * sd + 1e-3;
    }
    assert_int_equal(differ, 0);
    assert_true(fabs(total - 1) < 1e-5);
    rlx_sampler_destroy(a);
    rlx_sampler_destroy(b);

    /* top-k 3 only ever yields the three largest logits; top-p keeps the smallest prefix */
    p.top_k = 3;
    assert_ok(rlx_sampler_create(&p, V, &a));
    for (int i = 0; i < 500; i++) {
        int32_t x = rlx_sampler_sample(a, logits);
        assert_true(logits[x] >= 4.7f);
    }
    rlx_sampler_destroy(a);
    p.top_k = 0;
    p.top_p = 1e-4f;
    assert_ok(rlx_sampler_create(&p, V, &a));
    rlx_sampler_probs(a, logits, probs);
    for (int i = 0; i < V; i++)
        assert_true(probs[i] == (logits[i] >= 4.9f ? 1.0f : 0.0f));
    rlx_sampler_destroy(a);
    p.top_p = 0;
    assert_int_equal(rlx_sampler_create(&p, V, &a), RLX_E_INVALID);
    p.top_p = 1;
    p.temperature = -1;
    assert_int_equal(rlx_sampler_create(&p, V, &a), RLX_E_INVALID);
    assert_error_mentions("temperature");
}

typedef struct row_log {
    int32_t tokens[32];
    float *rows; /* [32, vocab] */
    uint32_t n, stop_after;
} row_log;

static int log_row(void *ctx, int32_t token, const float *logits) {
    row_log *r = ctx;
    memcpy(r->rows + (size_t)r->n * (size_t)vocab, logits, (size_t)vocab * sizeof *logits);
    r->tokens[r->n++] = token;
    return r->stop_after && r->n == r->stop_after;
}

/* Each token's row is the model's logits after the prompt and the tokens before it, as a fresh
 * session computes them; the stop reasons are told apart. */
static void test_generate_ex_gives_each_tokens_row(void **state) {
    (void)state;
    rlx_session *s = new_session(64), *check = new_session(64);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    lm.n_eos = 0;
    rlx_sampler_params p = rlx_sampler_params_default();
    p.seed = 5;
    p.repeat_penalty = 1.3f;
    rlx_sampler *g;
    assert_ok(rlx_sampler_create(&p, vocab, &g));
    row_log r = {.rows = malloc(32 * (size_t)vocab * sizeof(float))};
    assert_non_null(r.rows);
    rlx_gen_stats st;
    assert_ok(rlx_generate(&lm, g, prompt, N_PROMPT, 12, log_row, &r, &st));
    assert_int_equal(r.n, 12);
    assert_int_equal(st.stop, RLX_GEN_STOP_MAX_NEW);
    int32_t eos = r.tokens[2];
    const float *want;
    assert_ok(rlx_session_forward(check, prompt, N_PROMPT, 0, &want));
    for (uint32_t i = 0; i < r.n; i++) {
        if (i)
            assert_ok(rlx_session_forward(check, &r.tokens[i - 1], 1, 0, &want));
        if (max_diff(r.rows + (size_t)i * (size_t)vocab, want, vocab) > 1e-4)
            fail_msg("token %u: the row given with it is not the model's row after the tokens before it", i);
    }
    /* the callback's stop, an EOS id (the 3rd token above, which a fresh sampler with the same
     * seed draws again), and no room at all */
    assert_ok(rlx_session_truncate(s, 0));
    r.n = 0;
    r.stop_after = 2;
    assert_ok(rlx_generate(&lm, g, prompt, N_PROMPT, 12, log_row, &r, &st));
    assert_int_equal(st.stop, RLX_GEN_STOP_CALLBACK);
    assert_int_equal(st.n_generated, 2);
    rlx_sampler_destroy(g);
    assert_ok(rlx_sampler_create(&p, vocab, &g));
    lm.eos_ids = &eos;
    lm.n_eos = 1;
    assert_ok(rlx_session_truncate(s, 0));
    r.n = 0;
    r.stop_after = 0;
    assert_ok(rlx_generate(&lm, g, prompt, N_PROMPT, 12, log_row, &r, &st));
    assert_int_equal(st.stop, RLX_GEN_STOP_EOS);
    assert_true(st.stopped_on_eos && st.n_generated <= 3 && r.tokens[r.n - 1] == eos);
    assert_ok(rlx_session_truncate(s, 0));
    assert_ok(rlx_generate(&lm, g, prompt, N_PROMPT, 0, NULL, NULL, &st));
    assert_int_equal(st.stop, RLX_GEN_STOP_MAX_NEW);
    assert_int_equal(st.n_generated, 0);
    free(r.rows);
    rlx_sampler_destroy(g);
    rlx_session_destroy(s);
    rlx_session_destroy(check);
}

/* A presence penalty far above any logit gap forbids every token of the context: under greedy
 * no generated token repeats one of the prompt or an earlier one, so both entered the history.
 * Without the penalty this model repeats itself, so the check is not vacuous. */
static void test_generate_feeds_the_penalties_prompt_and_output(void **state) {
    (void)state;
    rlx_session *s = new_session(64);
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = 1;
    int repeats[2] = {0, 0};
    for (int penalised = 0; penalised <= 1; penalised++) {
        p.presence_penalty = penalised ? 1e4f : 0;
        p.repeat_last_n = -1;
        rlx_sampler *g;
        assert_ok(rlx_sampler_create(&p, vocab, &g));
        row_log r = {.rows = malloc(32 * (size_t)vocab * sizeof(float))};
        assert_non_null(r.rows);
        assert_ok(rlx_session_truncate(s, 0));
        rlx_lm lm;
        assert_ok(rlx_session_lm(s, &lm));
        lm.n_eos = 0;
        assert_ok(rlx_generate(&lm, g, prompt, N_PROMPT, 24, log_row, &r, NULL));
        for (uint32_t i = 0; i < r.n; i++) {
            for (uint32_t j = 0; j < N_PROMPT; j++)
                repeats[penalised] += r.tokens[i] == prompt[j];
            for (uint32_t j = 0; j < i; j++)
                repeats[penalised] += r.tokens[i] == r.tokens[j];
        }
        free(r.rows);
        rlx_sampler_destroy(g);
    }
    assert_true(repeats[0] > 0);
    assert_int_equal(repeats[1], 0);
    rlx_session_destroy(s);
}

/* emit_hidden: a hidden row per position of the last forward, the logits unchanged, and the
 * rlx_lm view offers them; without it neither the session nor the lm has hidden rows. */
static void test_emit_hidden_rows_and_lm_view(void **state) {
    (void)state;
    const rlx_model_config *c = rlx_model_config_of(model);
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1,
                           .emit_hidden = 1};
    rlx_session_options o = {
        .size = sizeof(rlx_session_options), .kv_capacity = 64, .backends = &backend, .n_backends = 1};
    rlx_session *with, *plain = new_session(64);
    assert_ok(rlx_session_create(model, &spec, &o, &with));
    rlx_lm lm, plain_lm;
    assert_ok(rlx_session_lm(with, &lm));
    assert_ok(rlx_session_lm(plain, &plain_lm));
    assert_non_null(lm.hidden);
    assert_null(plain_lm.hidden);
    assert_int_equal(lm.hidden_size, c->hidden_size);
    const float *a, *b;
    assert_ok(rlx_session_forward(with, prompt, N_PROMPT, 0, &a));
    assert_ok(rlx_session_forward(plain, prompt, N_PROMPT, 0, &b));
    assert_true(max_diff(a, b, vocab) < 1e-5);
    assert_null(rlx_session_hidden(plain));
    const float *rows = lm.hidden(lm.self);
    assert_ptr_equal(rows, rlx_session_hidden(with));
    /* golden_mtp checks the values against NumPy; here only that every position has a row */
    for (uint32_t t = 0; t < N_PROMPT; t++) {
        double ss = 0;
        for (int64_t i = 0; i < c->hidden_size; i++)
            ss += (double)rows[t * c->hidden_size + i] * rows[t * c->hidden_size + i];
        assert_true(ss > 0 && isfinite(ss));
    }
    /* the rows stay readable across a truncate, which the speculative loop does before reading */
    assert_ok(rlx_session_truncate(with, 3));
    assert_ptr_equal(rlx_session_hidden(with), rows);
    rlx_session_destroy(with);
    rlx_session_destroy(plain);
}

/* MTP entry points refuse the wrong block, and a model without MTP tensors says what to add. */
static void test_mtp_errors(void **state) {
    (void)state;
    rlx_session *s = new_session(16);
    const float *out;
    float hidden[64] = {0};
    assert_int_equal(rlx_session_forward_mtp(s, prompt, hidden, 1, 0, &out), RLX_E_INVALID);
    assert_error_mentions("not an MTP layer");
    assert_false(rlx_model_has_mtp(model, 0));
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_start = 0,
                           .layer_end = 1,
                           .embed_input = 1,
                           .produce_logits = 1,
                           .mtp = 1};
    rlx_session_options o = {
        .size = sizeof(rlx_session_options), .kv_capacity = 16, .backends = &backend, .n_backends = 1};
    rlx_session *mtp = NULL;
    assert_int_equal(rlx_session_create(model, &spec, &o, &mtp), RLX_E_NOT_FOUND);
    /* the first MTP tensor under the architecture's names (MiMo's, or Qwen3.5's own) */
    const int qwen35 = strncmp(rlx_model_config_of(model)->model_type, "qwen3_5", 7) == 0;
    assert_error_mentions(qwen35 ? "mtp.pre_fc_norm_embedding.weight" : "model.mtp_layers.0.token_layernorm.weight");
    assert_error_mentions("weights=FILE");
    spec.layer_end = 2;
    assert_int_equal(rlx_model_check_block(model, &spec), RLX_E_INVALID);
    spec = (rlx_block_spec){.size = sizeof(rlx_block_spec), .layer_end = 1, .embed_input = 1, .emit_hidden = 1};
    assert_int_equal(rlx_model_check_block(model, &spec), RLX_E_INVALID);
    assert_error_mentions("produce_logits");
    assert_int_equal(rlx_model_add_weights(model, RLX_TEST_DATA "/no-such.safetensors"), RLX_E_IO);
    assert_error_mentions("no-such.safetensors");
    rlx_session_destroy(s);
}

static int setup(void **state) {
    (void)state;
    if (tu_open_model(model_dir, NULL, NULL, &model, &plugin, &backend) != 0)
        return -1;
    vocab = rlx_model_config_of(model)->vocab_size;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_close_model(model, plugin, backend);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) /* another model of the same vocabulary size or larger */
        model_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_decode_equals_recomputation),
        cmocka_unit_test(test_truncate_then_decode_equals_never_decoded),
        cmocka_unit_test(test_truncate_into_a_verification),
        cmocka_unit_test(test_truncate_after_single_steps),
        cmocka_unit_test(test_bad_tokens_and_overflow_are_refused),
        cmocka_unit_test(test_generate_stops_at_limit_and_is_greedy),
        cmocka_unit_test(test_generate_stops_at_a_full_context),
        cmocka_unit_test(test_sampler_reproducible_and_filtered),
        cmocka_unit_test(test_generate_ex_gives_each_tokens_row),
        cmocka_unit_test(test_generate_feeds_the_penalties_prompt_and_output),
        cmocka_unit_test(test_emit_hidden_rows_and_lm_view),
        cmocka_unit_test(test_mtp_errors),
    };
    return cmocka_run_group_tests_name("session", tests, setup, teardown);
}
