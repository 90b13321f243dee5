/* Speculative decoding on real (small, random) models: greedy output equals plain greedy token
 * for token with the draft plugin for k = 1..6 (a draft that often disagrees and the target
 * itself, which must have every draft accepted), also with penalties and at temperature 0,
 * stops land where plain decoding's do, rejected positions leave no trace in the target's
 * cache, each token comes with the target's row it was drawn from, the draft and MTP
 * speculators keep accepted drafts and forget rejected ones exactly, sampled output follows
 * the target's exact distribution (chi-square; plain, top-k, min-p and penalties that make it
 * depend on the tokens drawn before), and bad speculators and bad arguments are refused with
 * errors naming them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"
#include "model/model_fixture.h"

#define DATA RLX_TEST_DATA
#define TARGET DATA "/spec-target"
#define DRAFT DATA "/spec-draft"
#define TINY DATA "/spec-tiny"

static rlx_backend *backend;
static rlx_plugin_handle *backend_plugin, *draft_plugin, *mtp_plugin, *skewed_plugin, *old_plugin;
static rlx_model *target, *tiny;

static const int32_t prompt[] = {17, 3, 250, 99, 4, 301, 77, 12};
#define N_PROMPT (uint32_t)(sizeof prompt / sizeof prompt[0])
static const int32_t tiny_prompt[] = {1, 5, 3}; /* for the vocabulary of 16 */
#define N_TINY_PROMPT 3

static rlx_session *create_session(rlx_model *m, uint32_t capacity, int emit_hidden) {
    const rlx_model_config *c = rlx_model_config_of(m);
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1,
                           .emit_hidden = (uint32_t)emit_hidden};
    rlx_session_options o = {
        .size = sizeof(rlx_session_options), .kv_capacity = capacity, .backends = &backend, .n_backends = 1};
    rlx_session *s;
    assert_ok(rlx_session_create(m, &spec, &o, &s));
    return s;
}

static rlx_session *new_session(rlx_model *m, uint32_t capacity) { return create_session(m, capacity, 0); }

/* for the MTP speculator, which drafts from the target's final hidden states */
static rlx_session *new_session_emitting_hidden(rlx_model *m, uint32_t capacity) {
    return create_session(m, capacity, 1);
}

static rlx_status open_spec(rlx_plugin_handle *plugin, const rlx_lm *lm, const char *model_dir, const char *options,
                            rlx_speculator **out) {
    rlx_spec_target t = {.size = sizeof t,
                         .kv_capacity = lm->capacity(lm->self),
                         .model_dir = model_dir,
                         .vocab = lm->vocab,
                         .hidden_size = lm->hidden_size,
                         .backends = &backend,
                         .n_backends = 1,
                         .options = options};
    return rlx_speculator_create(plugin, &t, out);
}

typedef struct recorder {
    int32_t tokens[256];
    uint32_t n, stop_after; /* stop_after 0: never ask to stop */
} recorder;

static int record(void *ctx, int32_t token, const float *logits) {
    (void)logits;
    recorder *r = ctx;
    r->tokens[r->n++] = token;
    return r->stop_after && r->n == r->stop_after;
}

static rlx_sampler *new_sampler_with(rlx_sampler_params p, uint64_t seed, int64_t vocab) {
    p.seed = seed;
    rlx_sampler *s;
    assert_ok(rlx_sampler_create(&p, vocab, &s));
    return s;
}

static rlx_sampler *new_sampler(int greedy, float temperature, int32_t top_k, uint64_t seed, int64_t vocab) {
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = greedy;
    p.temperature = temperature;
    p.top_k = top_k;
    return new_sampler_with(p, seed, vocab);
}

/* rlx_generate's tokens for lm (truncated to empty first). */
static void plain_run(const rlx_lm *lm, uint32_t max_new, uint32_t stop_after, recorder *out) {
    rlx_sampler *g = new_sampler(1, 1, 0, 0, lm->vocab);
    *out = (recorder){.stop_after = stop_after};
    assert_ok(lm->truncate(lm->self, 0));
    assert_ok(rlx_generate(lm, g, prompt, N_PROMPT, max_new, record, out, NULL));
    rlx_sampler_destroy(g);
}

static void spec_run(const rlx_lm *lm, rlx_speculator *spec, uint32_t k, uint32_t max_new, uint32_t stop_after,
                     recorder *out, rlx_spec_stats *st) {
    rlx_sampler *g = new_sampler(1, 1, 0, 0, lm->vocab);
    *out = (recorder){.stop_after = stop_after};
    assert_ok(lm->truncate(lm->self, 0));
    assert_ok(rlx_spec_generate(lm, spec, k, g, prompt, N_PROMPT, max_new, record, out, st));
    rlx_sampler_destroy(g);
}

static void assert_same_tokens(const recorder *a, const recorder *b, const char *what, uint32_t k) {
    if (a->n != b->n)
        fail_msg("%s, k=%u: %u tokens, plain decoding gave %u", what, k, b->n, a->n);
    for (uint32_t i = 0; i < a->n; i++)
        if (a->tokens[i] != b->tokens[i])
            fail_msg("%s, k=%u: token %u is %d, plain decoding gave %d", what, k, i, b->tokens[i], a->tokens[i]);
}

static void test_greedy_equals_plain_with_draft_models(void **state) {
    (void)state;
    rlx_session *s = new_session(target, 128);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    recorder plain, spec_out;
    plain_run(&lm, 48, 0, &plain);
    const char *drafts[] = {DRAFT, TARGET};
    for (int d = 0; d < 2; d++) {
        char options[512];
        snprintf(options, sizeof options, "model=%s", drafts[d]);
        rlx_speculator *spec;
        assert_ok(open_spec(draft_plugin, &lm, TARGET, options, &spec));
        for (uint32_t k = 1; k <= 6; k++) {
            rlx_spec_stats st;
            spec_run(&lm, spec, k, 48, 0, &spec_out, &st);
            assert_same_tokens(&plain, &spec_out, drafts[d], k);
            assert_int_equal(st.gen.n_generated, plain.n);
            assert_true(st.accepted <= st.proposed && st.proposed <= (uint64_t)k * st.rounds);
            assert_true(rlx_spec_tokens_per_pass(&st) >= 1.0);
            if (d == 1) /* the target drafting for itself agrees with itself */
                assert_int_equal(st.accepted, st.proposed);
            else
                assert_true(st.accepted < st.proposed);
        }
        rlx_speculator_destroy(spec);
    }
    rlx_session_destroy(s);
}

/* EOS, max_new and the callback's stop end speculative decoding on the same token as plain
 * decoding, also when the stop falls inside a round of drafts. */
static void test_greedy_stops_like_plain(void **state) {
    (void)state;
    rlx_session *s = new_session(target, 128);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    rlx_speculator *spec;
    assert_ok(open_spec(draft_plugin, &lm, TARGET, "model=" TARGET, &spec));
    recorder plain, out;
    rlx_spec_stats st;
    plain_run(&lm, 48, 0, &plain);
    /* an EOS id: a token of the plain output that first appears after a few tokens */
    int32_t eos = -1;
    for (uint32_t i = 3; i < plain.n && eos < 0; i++) {
        int seen = 0;
        for (uint32_t j = 0; j < i; j++)
            seen |= plain.tokens[j] == plain.tokens[i];
        if (!seen)
            eos = plain.tokens[i];
    }
    assert_true(eos >= 0);
    rlx_lm with_eos = lm;
    with_eos.eos_ids = &eos;
    with_eos.n_eos = 1;
    recorder plain_eos;
    plain_run(&with_eos, 48, 0, &plain_eos);
    assert_true(plain_eos.n < plain.n && plain_eos.tokens[plain_eos.n - 1] == eos);
    for (uint32_t k = 1; k <= 6; k++) {
        spec_run(&with_eos, spec, k, 48, 0, &out, &st);
        assert_same_tokens(&plain_eos, &out, "EOS", k);
        assert_true(st.gen.stopped_on_eos);
        assert_int_equal(st.gen.stop, RLX_GEN_STOP_EOS);
        /* the cache holds the prompt and every token but the last, as rlx_generate leaves it */
        assert_int_equal(rlx_session_length(s), N_PROMPT + out.n - 1);
        for (uint32_t limit = 1; limit <= 9; limit += 4) {
            plain_run(&lm, limit, 0, &plain);
            spec_run(&lm, spec, k, limit, 0, &out, &st);
            assert_same_tokens(&plain, &out, "max_new", k);
            assert_int_equal(st.gen.stop, RLX_GEN_STOP_MAX_NEW);
            plain_run(&lm, 48, limit, &plain);
            spec_run(&lm, spec, k, 48, limit, &out, &st);
            assert_same_tokens(&plain, &out, "callback stop", k);
            assert_int_equal(st.gen.stop, RLX_GEN_STOP_CALLBACK);
            assert_int_equal(rlx_session_length(s), N_PROMPT + out.n - 1);
        }
    }
    rlx_speculator_destroy(spec);
    rlx_session_destroy(s);
    /* a context that fills up: the same tokens as plain decoding, which stops there too */
    for (uint32_t k = 1; k <= 6; k++) {
        const uint32_t capacity = N_PROMPT + 2 + k;
        rlx_session *small = new_session(target, capacity);
        rlx_lm small_lm;
        assert_ok(rlx_session_lm(small, &small_lm));
        assert_ok(open_spec(draft_plugin, &small_lm, TARGET, "model=" TARGET, &spec));
        plain_run(&small_lm, 48, 0, &plain);
        assert_int_equal(plain.n, capacity - N_PROMPT + 1);
        spec_run(&small_lm, spec, k, 48, 0, &out, &st);
        assert_same_tokens(&plain, &out, "full context", k);
        assert_int_equal(st.gen.stop, RLX_GEN_STOP_CONTEXT);
        assert_int_equal(rlx_session_length(small), capacity);
        rlx_speculator_destroy(spec);
        rlx_session_destroy(small);
    }
}

/* Penalties under greedy: speculative decoding (greedy, or temperature 0) emits plain greedy's
 * tokens, and so does plain decoding at temperature 0. The penalties change plain greedy's
 * output, so the drafts' places in the history matter. */
static void test_greedy_with_penalties_equals_plain(void **state) {
    (void)state;
    rlx_session *s = new_session(target, 128);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    rlx_speculator *spec;
    assert_ok(open_spec(draft_plugin, &lm, TARGET, "model=" DRAFT, &spec));
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = 1;
    p.repeat_penalty = 1.5f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.3f;
    p.repeat_last_n = 12;
    recorder unpenalised, plain, out;
    plain_run(&lm, 48, 0, &unpenalised);
    rlx_sampler *g = new_sampler_with(p, 0, lm.vocab);
    plain = (recorder){0};
    assert_ok(lm.truncate(lm.self, 0));
    assert_ok(rlx_generate(&lm, g, prompt, N_PROMPT, 48, record, &plain, NULL));
    rlx_sampler_destroy(g);
    int differs = unpenalised.n != plain.n;
    for (uint32_t i = 0; i < plain.n && !differs; i++)
        differs = unpenalised.tokens[i] != plain.tokens[i];
    assert_true(differs);
    rlx_sampler_params zero = p;
    zero.greedy = 0;
    zero.temperature = 0;
    g = new_sampler_with(zero, 0, lm.vocab);
    out = (recorder){0};
    assert_ok(lm.truncate(lm.self, 0));
    assert_ok(rlx_generate(&lm, g, prompt, N_PROMPT, 48, record, &out, NULL));
    rlx_sampler_destroy(g);
    assert_same_tokens(&plain, &out, "plain, temperature 0", 0);
    for (int at_zero = 0; at_zero <= 1; at_zero++)
        for (uint32_t k = 1; k <= 6; k++) {
            g = new_sampler_with(at_zero ? zero : p, 0, lm.vocab);
            out = (recorder){0};
            rlx_spec_stats st;
            assert_ok(lm.truncate(lm.self, 0));
            assert_ok(rlx_spec_generate(&lm, spec, k, g, prompt, N_PROMPT, 48, record, &out, &st));
            rlx_sampler_destroy(g);
            assert_same_tokens(&plain, &out, at_zero ? "temperature 0 with penalties" : "greedy with penalties", k);
            assert_true(st.accepted > 0 && st.accepted < st.proposed);
        }
    rlx_speculator_destroy(spec);
    rlx_session_destroy(s);
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

/* After sampled speculative decoding (with many rejections), the target's cache answers a probe
 * token as a cache built by plain forwards of the emitted tokens does. Positions computed in
 * batches of another width differ by rounding only; a kept rejected draft would shift them. */
static void test_rollback_leaves_target_cache_as_plain(void **state) {
    (void)state;
    rlx_session *s = new_session(target, 128), *ref = new_session(target, 128);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    rlx_speculator *spec;
    assert_ok(open_spec(draft_plugin, &lm, TARGET, "model=" DRAFT, &spec));
    rlx_sampler *g = new_sampler(0, 1.0f, 0, 3, lm.vocab);
    recorder out = {0};
    rlx_spec_stats st;
    assert_ok(rlx_spec_generate(&lm, spec, 4, g, prompt, N_PROMPT, 40, record, &out, &st));
    assert_true(st.accepted < st.proposed); /* some drafts were rolled back */
    assert_int_equal(rlx_session_length(s), N_PROMPT + out.n - 1);
    const float *a, *b;
    assert_ok(rlx_session_forward(ref, prompt, N_PROMPT, 0, &b));
    if (out.n > 1)
        assert_ok(rlx_session_forward(ref, out.tokens, out.n - 1, 0, &b));
    int32_t probe = out.tokens[out.n - 1];
    assert_ok(rlx_session_forward(s, &probe, 1, 0, &a));
    assert_ok(rlx_session_forward(ref, &probe, 1, 0, &b));
    assert_true(max_diff(a, b, lm.vocab) < 1e-4);
    rlx_sampler_destroy(g);
    rlx_speculator_destroy(spec);
    rlx_session_destroy(s);
    rlx_session_destroy(ref);
}

typedef struct row_recorder {
    recorder r;
    float *rows; /* [256, vocab] */
    int64_t vocab;
} row_recorder;

static int record_row(void *ctx, int32_t token, const float *logits) {
    row_recorder *rr = ctx;
    memcpy(rr->rows + (size_t)rr->r.n * (size_t)rr->vocab, logits, (size_t)rr->vocab * sizeof *logits);
    return record(&rr->r, token, logits);
}

/* Sampled speculative decoding with many rejections and penalties: each token comes with the
 * target's row after the prompt and the tokens before it (a verification row; a correction's
 * is the row of the rejected draft's position), as plain forwards compute it. */
static void test_each_token_comes_with_its_target_row(void **state) {
    (void)state;
    rlx_session *s = new_session(target, 128), *ref = new_session(target, 128);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    lm.n_eos = 0;
    rlx_speculator *spec;
    assert_ok(open_spec(draft_plugin, &lm, TARGET, "model=" DRAFT, &spec));
    rlx_sampler_params p = rlx_sampler_params_default();
    p.repeat_penalty = 1.3f;
    rlx_sampler *g = new_sampler_with(p, 11, lm.vocab);
    row_recorder out = {.vocab = lm.vocab};
    out.rows = malloc(40 * (size_t)lm.vocab * sizeof *out.rows);
    assert_non_null(out.rows);
    rlx_spec_stats st;
    assert_ok(rlx_spec_generate(&lm, spec, 4, g, prompt, N_PROMPT, 40, record_row, &out, &st));
    assert_int_equal(out.r.n, 40);
    assert_true(st.accepted > 0 && st.accepted < st.proposed);
    const float *want;
    assert_ok(rlx_session_forward(ref, prompt, N_PROMPT, 0, &want));
    for (uint32_t i = 0; i < out.r.n; i++) {
        if (i)
            assert_ok(rlx_session_forward(ref, &out.r.tokens[i - 1], 1, 0, &want));
        double diff = max_diff(out.rows + (size_t)i * (size_t)lm.vocab, want, lm.vocab);
        if (diff > 1e-4)
            fail_msg("token %u: its row differs from the target's row at its position by %.3g", i, diff);
    }
    free(out.rows);
    rlx_sampler_destroy(g);
    rlx_speculator_destroy(spec);
    rlx_session_destroy(s);
    rlx_session_destroy(ref);
}

/* A speculator keeps the state of accepted drafts and forgets the rest: after every update, its
 * proposal equals the one a fresh speculator makes from the whole accepted context at once. The
 * updates claim acceptances the weights would not produce (random MTP drafts are never accepted
 * in real decoding): part of a proposal, all of it plus a bonus token, none of it. Both are
 * given the same hidden rows, from one target session with emit_hidden. Each step passes a new
 * seed, on which the plugins start a new generator, so the kept and the fresh speculator draw
 * from the same stream and every token and probability row can be compared, not just the
 * first. */
#define KEPT_K 4
#define KEPT_CONTEXT (N_PROMPT + 1 + 5 * (KEPT_K + 1))

typedef struct accepted_context {
    rlx_session *target; /* emit_hidden: rows[p] is its final hidden state at position p */
    int32_t tokens[KEPT_CONTEXT];
    float *rows;
    uint32_t n;
    int64_t hidden_size;
} accepted_context;

static void context_append(accepted_context *c, const int32_t *tokens, uint32_t n) {
    assert_true(c->n + n <= KEPT_CONTEXT);
    const float *logits;
    assert_ok(rlx_session_forward(c->target, tokens, n, 0, &logits));
    memcpy(c->tokens + c->n, tokens, n * sizeof *tokens);
    memcpy(c->rows + (size_t)c->n * c->hidden_size, rlx_session_hidden(c->target),
           (size_t)n * c->hidden_size * sizeof *c->rows);
    c->n += n;
}

/* The update telling a speculator the last n_new tokens of c, the first n_accepted of them
 * accepted drafts; hidden rows (when it needs them) for every token that has a state before it. */
static rlx_spec_update context_update(const accepted_context *c, uint32_t n_new, uint32_t n_accepted, int hidden) {
    uint32_t first = c->n - n_new, first_row = first ? first - 1 : 0;
    return (rlx_spec_update){.size = sizeof(rlx_spec_update),
                             .tokens = c->tokens + first,
                             .n_tokens = n_new,
                             .n_accepted = n_accepted,
                             .hidden = hidden ? c->rows + (size_t)first_row * c->hidden_size : NULL,
                             .n_hidden = hidden ? c->n - 1 - first_row : 0};
}

static void check_kept_equals_fresh(rlx_plugin_handle *plugin, const char *options) {
    rlx_session *target_session = new_session_emitting_hidden(target, 128);
    rlx_lm lm;
    assert_ok(rlx_session_lm(target_session, &lm));
    size_t v = (size_t)lm.vocab;
    rlx_speculator *kept, *fresh;
    assert_ok(open_spec(plugin, &lm, TARGET, options, &kept));
    assert_ok(open_spec(plugin, &lm, TARGET, options, &fresh));
    const char *name = rlx_speculator_name(kept);
    int hidden = (rlx_speculator_flags(kept) & RLX_SPEC_NEEDS_HIDDEN) != 0;
    accepted_context c = {.target = target_session, .hidden_size = lm.hidden_size};
    c.rows = malloc(KEPT_CONTEXT * (size_t)lm.hidden_size * sizeof *c.rows);
    float *q_kept = malloc(KEPT_K * v * sizeof *q_kept), *q_fresh = malloc(KEPT_K * v * sizeof *q_fresh);
    assert_non_null(c.rows);
    assert_non_null(q_kept);
    assert_non_null(q_fresh);
    /* drafts accepted per step; more than the proposal means all of it and a bonus token */
    const uint32_t script[] = {2, KEPT_K, 0, 1, KEPT_K - 1};
    for (int greedy = 0; greedy <= 1; greedy++) {
        rlx_sampler_params p = rlx_sampler_params_default();
        p.greedy = greedy;
        int32_t d_kept[KEPT_K], d_fresh[KEPT_K];
        uint32_t n_kept, n_fresh;
        assert_ok(rlx_session_truncate(target_session, 0));
        c.n = 0;
        context_append(&c, prompt, N_PROMPT);
        context_append(&c, &(int32_t){7}, 1); /* the first generated token */
        assert_ok(rlx_speculator_reset(kept));
        rlx_spec_update u = context_update(&c, c.n, 0, hidden);
        assert_ok(rlx_speculator_propose(kept, &u, KEPT_K, &p, d_kept, q_kept, &n_kept));
        for (uint32_t step = 0; step < sizeof script / sizeof script[0]; step++) {
            assert_int_equal(n_kept, KEPT_K);
            uint32_t accepted = script[step] < n_kept ? script[step] : n_kept;
            int32_t added[KEPT_K + 1];
            memcpy(added, d_kept, accepted * sizeof *added);
            /* a correction differs from the rejected draft; a bonus token may be anything */
            added[accepted] = accepted < n_kept ? (d_kept[accepted] + 1) % (int32_t)v : (int32_t)(step * 37 % v);
            context_append(&c, added, accepted + 1);
            p.seed = 100 + step;
            u = context_update(&c, accepted + 1, accepted, hidden);
            assert_ok(rlx_speculator_propose(kept, &u, KEPT_K, &p, d_kept, q_kept, &n_kept));
            assert_ok(rlx_speculator_reset(fresh));
            u = context_update(&c, c.n, 0, hidden);
            assert_ok(rlx_speculator_propose(fresh, &u, KEPT_K, &p, d_fresh, q_fresh, &n_fresh));
            if (n_kept != n_fresh)
                fail_msg("%s, greedy %d, step %u (%u of %u drafts accepted): %u tokens proposed, a fresh "
                         "speculator proposes %u",
                         name, greedy, step, accepted, KEPT_K, n_kept, n_fresh);
            for (uint32_t i = 0; i < n_kept; i++) {
                double diff = max_diff(q_kept + i * v, q_fresh + i * v, (int64_t)v);
                if (d_kept[i] != d_fresh[i] || diff > 1e-5)
                    fail_msg("%s, greedy %d, step %u (%u of %u drafts accepted): draft %u is %d, a fresh speculator's "
                             "%d; their probability rows differ by up to %.3g",
                             name, greedy, step, accepted, KEPT_K, i, d_kept[i], d_fresh[i], diff);
            }
        }
    }
    free(q_kept);
    free(q_fresh);
    free(c.rows);
    rlx_speculator_destroy(kept);
    rlx_speculator_destroy(fresh);
    rlx_session_destroy(target_session);
}

static void test_draft_keeps_accepted_like_fresh(void **state) {
    (void)state;
    check_kept_equals_fresh(draft_plugin, "model=" DRAFT);
}

static void test_mtp_keeps_accepted_like_fresh(void **state) {
    (void)state;
    check_kept_equals_fresh(mtp_plugin, NULL);
}

// ---- the sampled distribution ----

#define SEEDS 4000
#define TINY_VOCAB 16
#define CHI2_Z_1E3 3.090232 /* standard normal quantile of 1 - 1e-3 */

/* Chi-square test of counts against probabilities: cells expecting fewer than 5 are pooled
 * (smallest first) until the pool expects 5. Fails when p < 1e-3, with the critical value from
 * the Wilson-Hilferty approximation; a count on a token of probability 0 fails outright. */
static void assert_chi_square(const char *what, const uint32_t *count, const double *prob, int n, uint32_t total) {
    int order[TINY_VOCAB];
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = 0; i < n; i++) /* ascending by probability */
        for (int j = i + 1; j < n; j++)
            if (prob[order[j]] < prob[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    double chi2 = 0, pool_e = 0, pool_o = 0;
    int cells = 0;
    for (int r = 0; r < n; r++) {
        int i = order[r];
        if (prob[i] == 0) {
            if (count[i])
                fail_msg("%s: token %d has probability 0 but was emitted %u times", what, i, count[i]);
            continue;
        }
        pool_e += prob[i] * total;
        pool_o += count[i];
        if (pool_e >= 5) {
            chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
            cells++;
            pool_e = pool_o = 0;
        }
    }
    if (pool_e > 0) { /* a pool still short of 5 at the end counts as a cell too */
        chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    double df = cells - 1, h = 2.0 / (9.0 * df);
    double critical = df * pow(1 - h + CHI2_Z_1E3 * sqrt(h), 3);
    print_message("%s: chi-square %.2f over %d cells, critical value %.2f at p = 1e-3\n", what, chi2, cells, critical);
    if (chi2 > critical)
        fail_msg("%s: chi-square %.2f > %.2f: the emitted tokens do not follow the target's distribution", what, chi2,
                 critical);
}

/* probs of the token after prompt + ctx[0..n) under the sampler's penalties and filters, the
 * penalties seeing that context */
static void target_probs(rlx_session *s, rlx_sampler *g, const int32_t *ctx, uint32_t n, double *out) {
    const float *logits;
    float p[TINY_VOCAB];
    assert_ok(rlx_session_truncate(s, 0));
    assert_ok(rlx_session_forward(s, tiny_prompt, N_TINY_PROMPT, 0, &logits));
    if (n)
        assert_ok(rlx_session_forward(s, ctx, n, 0, &logits));
    rlx_sampler_reset_history(g);
    for (uint32_t i = 0; i < N_TINY_PROMPT; i++)
        assert_ok(rlx_sampler_accept(g, tiny_prompt[i]));
    for (uint32_t i = 0; i < n; i++)
        assert_ok(rlx_sampler_accept(g, ctx[i]));
    rlx_sampler_probs(g, logits, p);
    for (int i = 0; i < TINY_VOCAB; i++)
        out[i] = p[i];
}

/* The exact marginals of the 1st, 2nd and 3rd generated token under the target with params:
 * p3(c) = sum over a, b of p(a) p(b | a) p(c | a, b), each conditional computed with its own
 * context in the penalties' history, so they hold with penalties too. */
typedef struct marginals {
    double p[3][TINY_VOCAB];
} marginals;

static marginals exact_marginals(rlx_sampler_params params) {
    rlx_session *ref = new_session(tiny, 16);
    rlx_sampler *exact = new_sampler_with(params, 0, TINY_VOCAB);
    marginals m = {0};
    double cond[TINY_VOCAB], cond2[TINY_VOCAB];
    target_probs(ref, exact, NULL, 0, m.p[0]);
    for (int32_t a = 0; a < TINY_VOCAB; a++) {
        if (m.p[0][a] == 0)
            continue;
        target_probs(ref, exact, &a, 1, cond);
        for (int32_t b = 0; b < TINY_VOCAB; b++) {
            m.p[1][b] += m.p[0][a] * cond[b];
            if (cond[b] == 0)
                continue;
            int32_t ab[2] = {a, b};
            target_probs(ref, exact, ab, 2, cond2);
            for (int c = 0; c < TINY_VOCAB; c++)
                m.p[2][c] += m.p[0][a] * cond[b] * cond2[c];
        }
    }
    rlx_sampler_destroy(exact);
    rlx_session_destroy(ref);
    return m;
}

/* The 2nd and 3rd tokens (the first ones through verification: accepted drafts, corrections
 * from max(0, p - q) and bonus tokens) against their exact marginals under the target, with
 * drafts from a context-free skewed q, k per round. Checked to fail when the rule is broken
 * (always accepting, drawing corrections from p instead of max(0, p - q), or judging a draft
 * without the kept drafts before it in the penalties' history). */
static void check_distribution_of(const char *name, rlx_sampler_params params, uint32_t k) {
    rlx_session *s = new_session(tiny, 16);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    lm.n_eos = 0; /* count every token; an EOS would end the sequence before the tokens measured */
    assert_int_equal(lm.vocab, TINY_VOCAB);
    rlx_speculator *spec;
    assert_ok(open_spec(skewed_plugin, &lm, TINY, NULL, &spec));
    marginals m = exact_marginals(params);
    uint32_t count2[TINY_VOCAB] = {0}, count3[TINY_VOCAB] = {0};
    uint64_t proposed = 0, accepted = 0;
    for (uint64_t seed = 0; seed < SEEDS; seed++) {
        rlx_sampler *g = new_sampler_with(params, seed, TINY_VOCAB);
        recorder out = {0};
        rlx_spec_stats st;
        assert_ok(rlx_session_truncate(s, 0));
        assert_ok(rlx_spec_generate(&lm, spec, k, g, tiny_prompt, N_TINY_PROMPT, 4, record, &out, &st));
        assert_int_equal(out.n, 4);
        count2[out.tokens[1]]++;
        count3[out.tokens[2]]++;
        proposed += st.proposed;
        accepted += st.accepted;
        rlx_sampler_destroy(g);
    }
    char what[96];
    snprintf(what, sizeof what, "%s, k=%u, 2nd token", name, k);
    assert_chi_square(what, count2, m.p[1], TINY_VOCAB, SEEDS);
    snprintf(what, sizeof what, "%s, k=%u, 3rd token", name, k);
    assert_chi_square(what, count3, m.p[2], TINY_VOCAB, SEEDS);
    /* both branches of the rule were exercised many times */
    assert_true(accepted > SEEDS / 4 && proposed - accepted > SEEDS / 4);
    rlx_speculator_destroy(spec);
    rlx_session_destroy(s);
}

static void check_distribution(float temperature, int32_t top_k) {
    rlx_sampler_params p = rlx_sampler_params_default();
    p.temperature = temperature;
    p.top_k = top_k;
    char name[48];
    snprintf(name, sizeof name, "T=%.1f top-k %d", (double)temperature, top_k);
    check_distribution_of(name, p, 1);
}

static void test_sampled_tokens_follow_target_distribution(void **state) {
    (void)state;
    check_distribution(1.0f, 0);
}

/* top-k leaves the target no mass where q has some: corrections come from p's support only */
static void test_sampled_tokens_follow_filtered_distribution(void **state) {
    (void)state;
    check_distribution(1.0f, 5);
}

/* min-p as well; it must really cut tokens for the check to mean anything */
static void test_sampled_tokens_follow_min_p_distribution(void **state) {
    (void)state;
    rlx_sampler_params p = rlx_sampler_params_default();
    p.min_p = 0.25f;
    marginals m = exact_marginals(p);
    int cut = 0;
    for (int i = 0; i < TINY_VOCAB; i++)
        cut += m.p[0][i] == 0;
    assert_true(cut >= 4);
    check_distribution_of("min-p 0.25", p, 2);
}

/* With penalties each token's distribution depends on the ones drawn before it. The window of
 * 4 moves past the 3-token prompt within the tokens measured, and two drafts a round make the
 * second draft's row depend on the first. The penalties must move the 3rd token's marginal
 * for the check to mean anything. */
static void test_sampled_tokens_follow_penalised_distribution(void **state) {
    (void)state;
    rlx_sampler_params p = rlx_sampler_params_default();
    p.repeat_penalty = 2.5f;
    p.presence_penalty = 0.8f;
    p.frequency_penalty = 0.6f;
    p.repeat_last_n = 4;
    marginals with = exact_marginals(p), without = exact_marginals(rlx_sampler_params_default());
    double tv = 0;
    for (int i = 0; i < TINY_VOCAB; i++)
        tv += fabs(with.p[2][i] - without.p[2][i]) / 2;
    print_message("the penalties move the 3rd token's marginal by %.3f in total variation\n", tv);
    assert_true(tv > 0.1);
    check_distribution_of("penalties", p, 2);
}

// ---- refusals ----

static void test_bad_speculators_and_arguments_are_refused(void **state) {
    (void)state;
    rlx_session *s = new_session(tiny, 16);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    rlx_speculator *spec = (rlx_speculator *)&spec;
    rlx_sampler *g = new_sampler(0, 1, 0, 1, lm.vocab);
    assert_ok(open_spec(skewed_plugin, &lm, TINY, NULL, &spec));
    assert_int_equal(rlx_spec_generate(&lm, spec, 0, g, tiny_prompt, N_TINY_PROMPT, 4, NULL, NULL, NULL), RLX_E_RANGE);
    assert_error_mentions("draft tokens must be from 1 to 64");
    assert_int_equal(
        rlx_spec_generate(&lm, spec, RLX_SPEC_MAX_DRAFT + 1, g, tiny_prompt, N_TINY_PROMPT, 4, NULL, NULL, NULL),
        RLX_E_RANGE);
    rlx_speculator_destroy(spec);
    const char *modes[][2] = {{"mode=out_of_vocab", "outside the vocabulary"},
                              {"mode=zero_prob", "probability 0"},
                              {"mode=negative", "finite non-negative"},
                              {"mode=too_many", "asked for at most"}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        assert_ok(open_spec(skewed_plugin, &lm, TINY, modes[i][0], &spec));
        assert_ok(rlx_session_truncate(s, 0));
        assert_int_equal(rlx_spec_generate(&lm, spec, 2, g, tiny_prompt, N_TINY_PROMPT, 4, NULL, NULL, NULL),
                         RLX_E_PLUGIN);
        assert_error_mentions("speculator 'skewed'");
        assert_error_mentions(modes[i][1]);
        rlx_speculator_destroy(spec);
    }
    assert_int_equal(open_spec(skewed_plugin, &lm, TINY, "colour=red", &spec), RLX_E_INVALID);
    assert_null(spec);
    assert_error_mentions("speculator 'skewed': cannot open: unknown option");
    /* the draft plugin: no model, another vocabulary, unknown options, another tokenizer */
    rlx_session *t = new_session(target, 64);
    rlx_lm tl;
    assert_ok(rlx_session_lm(t, &tl));
    assert_int_equal(open_spec(draft_plugin, &tl, TARGET, NULL, &spec), RLX_E_INVALID);
    assert_error_mentions("model=DIR");
    assert_int_equal(open_spec(draft_plugin, &tl, TARGET, "model=" DATA "/spec-vocab256", &spec), RLX_E_INVALID);
    assert_error_mentions("vocabulary of 256 tokens");
    assert_int_equal(open_spec(draft_plugin, &tl, TARGET, "model=" DRAFT ",depth=3", &spec), RLX_E_INVALID);
    assert_error_mentions("unknown option 'depth'");
    assert_true(open_spec(draft_plugin, &tl, TARGET, "model=/nonexistent/draft", &spec) < 0);
    assert_error_mentions("/nonexistent/draft");
    char *dir = fixture_dir_create(), *other = fixture_dir_create();
    char link_from[PATH_MAX];
    for (int f = 0; f < 2; f++) {
        const char *name = f ? "model.safetensors" : "config.json";
        snprintf(link_from, sizeof link_from, "%s/%s", DRAFT, name);
        assert_int_equal(symlink(link_from, fixture_path(dir, name)), 0);
    }
    fixture_write_text(dir, "tokenizer.json", "{\"model\": \"one\"}");
    fixture_write_text(other, "tokenizer.json", "{\"model\": \"two\"}");
    char options[PATH_MAX + 8];
    snprintf(options, sizeof options, "model=%s", dir);
    assert_int_equal(open_spec(draft_plugin, &tl, other, options, &spec), RLX_E_INVALID);
    assert_error_mentions("tokenizer.json differs");
    fixture_write_text(other, "tokenizer.json", "{\"model\": \"one\"}");
    assert_ok(open_spec(draft_plugin, &tl, other, options, &spec));
    rlx_speculator_destroy(spec);
    fixture_dir_remove(dir);
    fixture_dir_remove(other);
    free(dir);
    free(other);
    /* a speculator opened for another vocabulary, and a backend handle passed as a speculator */
    assert_ok(open_spec(skewed_plugin, &lm, TINY, NULL, &spec));
    assert_int_equal(rlx_spec_generate(&tl, spec, 2, g, tiny_prompt, N_TINY_PROMPT, 4, NULL, NULL, NULL),
                     RLX_E_INVALID);
    assert_error_mentions("vocabulary");
    rlx_speculator_destroy(spec);
    assert_int_equal(open_spec(backend_plugin, &lm, TINY, NULL, &spec), RLX_E_INVALID);
    assert_error_mentions("not a speculator");
    rlx_registry *r;
    rlx_plugin_handle *h;
    assert_ok(rlx_registry_create(NULL, &r));
    assert_int_equal(rlx_registry_load(r, RLX_PLUGIN_SPECULATOR, "no-such-speculator", &h), RLX_E_NOT_FOUND);
    rlx_registry_destroy(r);
    rlx_sampler_destroy(g);
    rlx_session_destroy(s);
    rlx_session_destroy(t);
}

/* A speculator built against the first sized ABI (tests/spec/frozen/) hands the core a shorter
 * rlx_sampler_params, rlx_session_options and rlx_block_spec, each followed by 0xff bytes: the
 * core must read them as far as their size and default the rest, or the sampler sees NaN
 * filters, the session a wild rules pointer and the block an MTP layer. It drafts with the target itself, so under greedy nearly every
 * draft is accepted and the output is plain decoding's; sampled, it must run to the end. */
static void test_speculator_built_for_older_structs_runs(void **state) {
    (void)state;
    rlx_session *s = new_session(target, 128);
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    rlx_speculator *spec;
    assert_ok(open_spec(old_plugin, &lm, TARGET, NULL, &spec));
    recorder plain, got;
    rlx_spec_stats st;
    plain_run(&lm, 24, 0, &plain);
    spec_run(&lm, spec, 3, 24, 0, &got, &st);
    assert_same_tokens(&plain, &got, "old speculator", 3);
    if (rlx_spec_acceptance_rate(&st) < 0.9)
        fail_msg("old speculator drafting with the target itself: acceptance %.3f", rlx_spec_acceptance_rate(&st));
    rlx_sampler *g = new_sampler(0, 0.8f, 20, 7, lm.vocab);
    recorder sampled = {.stop_after = 0};
    assert_ok(lm.truncate(lm.self, 0));
    assert_ok(rlx_spec_generate(&lm, spec, 3, g, prompt, N_PROMPT, 16, record, &sampled, &st));
    assert_int_equal(sampled.n, 16);
    assert_true(st.proposed > 0);
    rlx_sampler_destroy(g);
    rlx_speculator_destroy(spec);
    /* a size below the first version is refused, not read */
    rlx_sampler_params p = rlx_sampler_params_default();
    p.size = RLX_SAMPLER_PARAMS_SIZE_1 - 8;
    rlx_sampler *bad;
    assert_int_equal(rlx_sampler_create(&p, lm.vocab, &bad), RLX_E_INVALID);
    assert_error_mentions("rlx_sampler_params.size");
    rlx_session_options so = {.size = 0, .kv_capacity = 16};
    rlx_block_spec bs = {.size = sizeof bs, .layer_end = 1, .embed_input = 1, .produce_logits = 1};
    rlx_session *none;
    assert_int_equal(rlx_session_create(target, &bs, &so, &none), RLX_E_INVALID);
    assert_error_mentions("rlx_session_options.size");
    so.size = sizeof so;
    bs.size = 0;
    assert_int_equal(rlx_session_create(target, &bs, &so, &none), RLX_E_INVALID);
    assert_error_mentions("rlx_block_spec.size");
    rlx_session_destroy(s);
}

static int setup(void **state) {
    (void)state;
    const char *name = getenv("RLX_BACKEND") ? getenv("RLX_BACKEND") : "cpu-blas";
    rlx_registry *r;
    if (rlx_registry_create(NULL, &r) != RLX_OK ||
        rlx_registry_load(r, RLX_PLUGIN_BACKEND, name, &backend_plugin) != RLX_OK ||
        rlx_registry_load(r, RLX_PLUGIN_SPECULATOR, "draft", &draft_plugin) != RLX_OK ||
        rlx_registry_load(r, RLX_PLUGIN_SPECULATOR, "mtp", &mtp_plugin) != RLX_OK ||
        rlx_plugin_load(RLX_TEST_SKEWED_SPECULATOR, &skewed_plugin) != RLX_OK ||
        rlx_plugin_load(RLX_TEST_OLD_SPECULATOR, &old_plugin) != RLX_OK ||
        rlx_backend_create(backend_plugin, NULL, &backend) != RLX_OK || rlx_model_open(TARGET, &target) != RLX_OK ||
        rlx_model_open(TINY, &tiny) != RLX_OK) {
        fprintf(stderr, "setup: %s\n", rlx_last_error());
        return -1;
    }
    rlx_registry_destroy(r);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rlx_model_close(target);
    rlx_model_close(tiny);
    rlx_backend_destroy(backend);
    rlx_plugin_unload(backend_plugin);
    rlx_plugin_unload(draft_plugin);
    rlx_plugin_unload(mtp_plugin);
    rlx_plugin_unload(skewed_plugin);
    rlx_plugin_unload(old_plugin);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_plain_with_draft_models),
        cmocka_unit_test(test_greedy_stops_like_plain),
        cmocka_unit_test(test_greedy_with_penalties_equals_plain),
        cmocka_unit_test(test_rollback_leaves_target_cache_as_plain),
        cmocka_unit_test(test_each_token_comes_with_its_target_row),
        cmocka_unit_test(test_draft_keeps_accepted_like_fresh),
        cmocka_unit_test(test_mtp_keeps_accepted_like_fresh),
        cmocka_unit_test(test_sampled_tokens_follow_target_distribution),
        cmocka_unit_test(test_sampled_tokens_follow_filtered_distribution),
        cmocka_unit_test(test_sampled_tokens_follow_min_p_distribution),
        cmocka_unit_test(test_sampled_tokens_follow_penalised_distribution),
        cmocka_unit_test(test_bad_speculators_and_arguments_are_refused),
        cmocka_unit_test(test_speculator_built_for_older_structs_runs),
    };
    return cmocka_run_group_tests_name("spec", tests, setup, teardown);
}
