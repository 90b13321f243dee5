/* The runtime (rlx/runtime.h) as an embedding program uses it: what it opens for a model,
 * backends and placement, its refusals of bad options, a speculator, an older (shorter)
 * options struct, and the stage mode's guards. On the shipped Brown models. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

#define TARGET RLX_SOURCE_DIR "/share/models/brown/target"
#define DRAFT RLX_SOURCE_DIR "/share/models/brown/draft"

static const rlx_runtime_backend ref = {.name = "ref"};

static rlx_runtime_options local_options(const rlx_runtime_backend *b, const char *place) {
    rlx_runtime_options o = rlx_runtime_options_default();
    o.model_dir = DRAFT;
    o.backends = b;
    o.n_backends = b ? 1 : 0;
    o.place = place;
    o.kv_capacity = 64;
    return o;
}

/* Opening must fail with status want and a message naming `mentions`, leaving *out NULL. */
static void assert_refused(const rlx_runtime_options *o, rlx_status want, const char *mentions) {
    rlx_runtime *rt = (rlx_runtime *)&rt; /* non-NULL sentinel */
    assert_int_equal(rlx_runtime_open(o, &rt), want);
    assert_null(rt);
    assert_error_mentions(mentions);
}

/* The backend each node of the plan for one position runs on, as rlx graph prints it. */
static char *plan_text(rlx_session *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_ok(rlx_session_dump_plan(s, 1, f));
    fclose(f);
    return text;
}

static void test_placement_reaches_the_plan(void **state) {
    (void)state;
    rlx_runtime_options o = local_options(&ref, "matmul=cpu-blas");
    rlx_runtime *rt;
    assert_ok(rlx_runtime_open(&o, &rt));
    /* the plain reference kernels need no instance; the placement opened cpu-blas */
    assert_null(rlx_runtime_main_backend(rt));
    assert_int_equal(rlx_runtime_n_backends(rt), 1);
    assert_string_equal(rlx_backend_name(rlx_runtime_backend_at(rt, 0)), "cpu-blas");
    assert_null(rlx_runtime_backend_at(rt, 1));
    size_t n_rules;
    const rlx_place_rule *rules = rlx_runtime_rules(rt, &n_rules);
    assert_int_equal(n_rules, 1);
    assert_int_equal(rules[0].op, RLX_OP_MATMUL);
    assert_ptr_equal(rules[0].backend, rlx_runtime_backend_at(rt, 0));
    assert_null(rlx_runtime_driver(rt));
    assert_null(rlx_runtime_speculator(rt));
    assert_int_equal(rlx_runtime_draft_tokens(rt), 0);
    assert_non_null(rlx_runtime_model(rt));
    assert_string_equal(rlx_runtime_model_dir(rt), DRAFT);
    const rlx_lm *lm = rlx_runtime_lm(rt);
    assert_non_null(lm);
    assert_int_equal(lm->capacity(lm->self), 64);
    assert_int_equal(lm->vocab, rlx_runtime_config(rt)->vocab_size);
    char *plan = plan_text(rlx_runtime_session(rt));
    assert_non_null(strstr(plan, "= matmul("));
    for (char *line = strtok(plan, "\n"); line; line = strtok(NULL, "\n")) {
        if (strstr(line, "= matmul(") && !strstr(line, "@cpu-blas"))
            fail_msg("a matmul not on cpu-blas: %s", line);
        if (strstr(line, "= rms_norm(") && !strstr(line, "@ref"))
            fail_msg("an rms_norm off the reference kernels: %s", line);
    }
    free(plan);
    rlx_runtime_close(rt);
    rlx_runtime_close(NULL);
}

/* A later rule for the same op replaces the earlier one, and naming a backend of the list
 * reuses its instance rather than opening another. */
static void test_placement_reuses_listed_backends(void **state) {
    (void)state;
    const rlx_runtime_backend blas = {.name = "CPU-BLAS", .n_threads = 1};
    rlx_runtime_options o = local_options(&blas, "attention=ref-is-not-a-plugin,attention=cpu-blas");
    rlx_runtime *rt = NULL;
    /* the first rule's backend is looked up even though a later one replaces it */
    assert_refused(&o, RLX_E_NOT_FOUND, "cannot load backend");
    o.place = "matmul=ref,matmul=cpu-blas";
    assert_refused(&o, RLX_E_INVALID, "reference kernels are the fallback");
    o.place = "attention=cpu-blas,ATTENTION=cpu-blas";
    assert_ok(rlx_runtime_open(&o, &rt));
    assert_int_equal(rlx_runtime_n_backends(rt), 1);
    size_t n_rules;
    const rlx_place_rule *rules = rlx_runtime_rules(rt, &n_rules);
    assert_int_equal(n_rules, 1);
    assert_ptr_equal(rules[0].backend, rlx_runtime_main_backend(rt));
    rlx_runtime_close(rt);
}

static void test_bad_options_are_refused(void **state) {
    (void)state;
    rlx_runtime_options o = local_options(NULL, NULL);
    o.size = 8;
    assert_refused(&o, RLX_E_INVALID, "rlx_runtime_options.size");
    o = local_options(NULL, NULL);
    o.model_dir = NULL;
    assert_refused(&o, RLX_E_INVALID, "no model directory");
    o = local_options(&(rlx_runtime_backend){.name = "no-such-backend"}, NULL);
    assert_refused(&o, RLX_E_NOT_FOUND, "cannot load backend");
    o = local_options(&(rlx_runtime_backend){.name = NULL}, NULL);
    assert_refused(&o, RLX_E_INVALID, "backend 0 has no name");
    o = local_options(&(rlx_runtime_backend){.name = "cpu-blas", .options = "colour=red"}, NULL);
    assert_refused(&o, RLX_E_INVALID, "cannot start backend");
    o = local_options(&ref, "matmul");
    assert_refused(&o, RLX_E_INVALID, "place: 'matmul' is not OP=BACKEND");
    o = local_options(&ref, "warp=cpu-blas");
    assert_refused(&o, RLX_E_INVALID, "place: 'warp' is not OP=BACKEND");
    o = local_options(&ref, NULL);
    o.model_dir = RLX_SOURCE_DIR "/share/models/brown";
    assert_refused(&o, RLX_E_IO, "cannot open model");
    o = local_options(&ref, NULL);
    o.speculator = "nope";
    assert_refused(&o, RLX_E_NOT_FOUND, "unknown speculator 'nope' (available: ");
    o.speculator = NULL;
    o.draft_tokens = 2;
    assert_refused(&o, RLX_E_INVALID, "need a speculator");
    o.speculator = "draft";
    o.draft_tokens = RLX_SPEC_MAX_DRAFT + 1;
    assert_refused(&o, RLX_E_INVALID, "draft_tokens must be from 1 to 64");
    o = local_options(&ref, NULL);
    o.flags = RLX_RUNTIME_STAGE;
    rlx_runtime *rt;
    assert_ok(rlx_runtime_open(&o, &rt));
    assert_null(rlx_runtime_lm(rt));
    assert_null(rlx_runtime_session(rt));
    assert_non_null(rlx_runtime_model(rt));
    rlx_runtime_close(rt);
    o.flags = 0;
    assert_ok(rlx_runtime_open(&o, &rt));
    rlx_stage_options so = rlx_stage_options_default();
    assert_int_equal(rlx_runtime_serve_stage(rt, NULL, &so), RLX_E_INVALID);
    assert_error_mentions("RLX_RUNTIME_STAGE");
    rlx_runtime_close(rt);
}

typedef struct recorder {
    int32_t tokens[64];
    uint32_t n;
} recorder;

static int record(void *ctx, int32_t token, const float *logits) {
    (void)logits;
    recorder *r = ctx;
    r->tokens[r->n++] = token;
    return 0;
}

/* The draft speculator opened by the runtime for the target, on its backends: under greedy
 * speculative decoding gives plain decoding's tokens. */
static void test_speculator_runs_on_the_runtime(void **state) {
    (void)state;
    const rlx_runtime_backend blas = {.name = "cpu-blas", .n_threads = 1};
    rlx_runtime_options o = local_options(&blas, NULL);
    o.model_dir = TARGET;
    o.kv_capacity = 128;
    o.speculator = "draft";
    o.draft_model = DRAFT;
    rlx_runtime *rt;
    assert_ok(rlx_runtime_open(&o, &rt));
    rlx_speculator *spec = rlx_runtime_speculator(rt);
    assert_non_null(spec);
    assert_string_equal(rlx_speculator_name(spec), "draft");
    assert_int_equal(rlx_runtime_draft_tokens(rt), RLX_RUNTIME_DEFAULT_DRAFT_TOKENS);
    const rlx_lm *lm = rlx_runtime_lm(rt);
    const int32_t prompt[] = {5, 17, 300, 42, 9};
    rlx_sampler_params sp = rlx_sampler_params_default();
    sp.greedy = 1;
    recorder plain = {.n = 0}, fast = {.n = 0};
    rlx_sampler *g;
    assert_ok(rlx_sampler_create(&sp, lm->vocab, &g));
    assert_ok(rlx_generate(lm, g, prompt, 5, 24, record, &plain, NULL));
    rlx_sampler_destroy(g);
    assert_ok(lm->truncate(lm->self, 0));
    assert_ok(rlx_sampler_create(&sp, lm->vocab, &g));
    rlx_spec_stats st;
    assert_ok(rlx_spec_generate(lm, spec, rlx_runtime_draft_tokens(rt), g, prompt, 5, 24, record, &fast, &st));
    rlx_sampler_destroy(g);
    assert_int_equal(fast.n, plain.n);
    assert_memory_equal(fast.tokens, plain.tokens, plain.n * sizeof plain.tokens[0]);
    assert_true(st.proposed > 0);
    rlx_runtime_close(rt);
}

/* An options struct from an older header ends before `place`: the core reads no further (the
 * bytes after it are 0xff) and runs the model on the default backend. */
static void test_older_options_struct_is_read_to_its_size(void **state) {
    (void)state;
    struct {
        rlx_runtime_options o;
        unsigned char poison[16];
    } padded;
    memset(&padded, 0xff, sizeof padded);
    padded.o = local_options(NULL, NULL);
    memset((char *)&padded.o + offsetof(rlx_runtime_options, place), 0xff,
           sizeof padded.o - offsetof(rlx_runtime_options, place));
    padded.o.size = offsetof(rlx_runtime_options, place);
    rlx_runtime *rt;
    assert_ok(rlx_runtime_open(&padded.o, &rt));
    assert_string_equal(rlx_backend_name(rlx_runtime_main_backend(rt)), "cpu-blas");
    size_t n_rules;
    rlx_runtime_rules(rt, &n_rules);
    assert_int_equal(n_rules, 0);
    assert_null(rlx_runtime_speculator(rt));
    const rlx_lm *lm = rlx_runtime_lm(rt);
    /* kv_capacity lies past the size too: the model's default */
    assert_int_equal(lm->capacity(lm->self), 1024);
    rlx_runtime_close(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement_reaches_the_plan),
        cmocka_unit_test(test_placement_reuses_listed_backends),
        cmocka_unit_test(test_bad_options_are_refused),
        cmocka_unit_test(test_speculator_runs_on_the_runtime),
        cmocka_unit_test(test_older_options_struct_is_read_to_its_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
