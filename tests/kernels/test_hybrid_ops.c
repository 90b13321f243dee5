/* The ops of ABI 1.6 (SIGMOID_MUL, SSM_CONV, GATED_DELTA, partial ROPE) and 1.7 (the recurrent
 * ops' state rows) on the core's reference kernels, through graphs and plans as a model runs
 * them:
 * - against NumPy (hybrid_ops_ref.py, float64, from the contract and Hugging Face's code): a
 *   prompt in one call and split over calls with the state carried, a row at position 0
 *   resetting the state, slots interleaved in any row order, GQA, Dk != Dv, the chunk-parallel
 *   form over runs that are not a multiple of a chunk, BF16/F16 weights, calls that must fail
 *   (positions not consecutive, slot out of range, negative position) leaving the state as it
 *   was, partial ROPE with and without factors, the state after every row (state rows);
 * - the chunk-parallel form against the recurrent one over the same rows (their difference is
 *   F32 rounding), and a slot's rows giving the same bits whatever else the call holds;
 * - graph validation of shapes, dtypes and params, naming the node and the input;
 * - the ABI: a backend built before 1.6 is never asked about these nodes, nor one built before
 *   1.7 about state rows;
 * - the in-tree backends (cpu-blas, onednn: the kernel library's kern_recurrent.c) on the same
 *   NumPy cases, at every ISA level this CPU has (isa=c, avx2, avx512, avx512_bf16, amx), each
 *   node placed on the backend so that nothing falls back to the reference kernels unseen. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "read_file.h"
#include "testutil.h"

#define CASES RLX_TEST_DATA "/hybrid_cases.bin"
#define MAX_INPUTS 10
#define MAX_ACTS 8

// ---------------------------------------------------------------------------------------------
// The cases file (layout in hybrid_ops_ref.py)

typedef struct reader {
    const char *p, *end;
} reader;

static void take(reader *r, void *dst, size_t n) {
    if ((size_t)(r->end - r->p) < n)
        fail_msg("%s is truncated", CASES);
    memcpy(dst, r->p, n);
    r->p += n;
}

static uint32_t take_u32(reader *r) {
    uint32_t v;
    take(r, &v, 4);
    return v;
}

/* A tensor record, its data copied to its own (aligned) buffer. */
static rlx_tensor take_tensor(reader *r) {
    rlx_tensor t = {0};
    t.dtype = take_u32(r);
    t.n_dims = take_u32(r);
    take(r, t.shape, sizeof t.shape);
    assert_true(t.n_dims >= 1 && t.n_dims <= RLX_MAX_DIMS);
    const size_t bytes = (size_t)rlx_tensor_numel(&t) * rlx_dtype_size((int)t.dtype);
    assert_true(bytes > 0);
    t.data = malloc(bytes);
    assert_non_null(t.data);
    take(r, t.data, bytes);
    return t;
}

typedef struct hyb_case {
    uint32_t op;
    char name[128];
    rlx_op_params params;
    uint32_t n_weights;
    rlx_tensor weights[2];
    int has_state;
    rlx_tensor state;
} hyb_case;

enum { K_ACT, K_WEIGHT, K_STATE, K_ROWS }; /* hyb_call.kind */

typedef struct hyb_call {
    uint32_t n_inputs;
    uint32_t kind[MAX_INPUTS], index[MAX_INPUTS]; /* K_* */
    uint32_t n_acts;
    rlx_tensor acts[MAX_ACTS];
    int32_t status;
    rlx_tensor want;
    rlx_tensor want_rows; /* with state_rows: the state after each row (zeros for a failing call) */
} hyb_call;

static void take_case_head(reader *r, hyb_case *c) {
    memset(c, 0, sizeof *c);
    c->op = take_u32(r);
    const uint32_t len = take_u32(r);
    assert_true(len < sizeof c->name);
    take(r, c->name, len);
    take(r, &c->params.eps, 4);
    take(r, &c->params.rope_theta, 4);
    take(r, &c->params.scale, 4);
    c->params.head_dim = take_u32(r);
    c->params.n_heads = take_u32(r);
    c->params.n_kv_heads = take_u32(r);
    c->params.head_dim_v = take_u32(r);
    c->params.rope_dims = take_u32(r);
    c->params.kv_tiled = take_u32(r);
    c->params.state_rows = take_u32(r);
    c->n_weights = take_u32(r);
    assert_true(c->n_weights <= 2);
    for (uint32_t i = 0; i < c->n_weights; i++)
        c->weights[i] = take_tensor(r);
    c->has_state = (int)take_u32(r);
    if (c->has_state)
        c->state = take_tensor(r);
}

static void take_call(reader *r, hyb_call *k, const hyb_case *c) {
    memset(k, 0, sizeof *k);
    k->n_inputs = take_u32(r);
    assert_true(k->n_inputs <= MAX_INPUTS);
    for (uint32_t i = 0; i < k->n_inputs; i++) {
        k->kind[i] = take_u32(r);
        k->index[i] = take_u32(r);
    }
    k->n_acts = take_u32(r);
    assert_true(k->n_acts <= MAX_ACTS);
    for (uint32_t i = 0; i < k->n_acts; i++)
        k->acts[i] = take_tensor(r);
    take(r, &k->status, 4);
    if (k->status == 0)
        k->want = take_tensor(r);
    if (c->params.state_rows)
        k->want_rows = take_tensor(r);
}

static void free_call(hyb_call *k) {
    for (uint32_t i = 0; i < k->n_acts; i++)
        free(k->acts[i].data);
    free(k->want.data);
    free(k->want_rows.data);
}

// ---------------------------------------------------------------------------------------------
// Running one node as a one-node graph

/* The backend the cases run on: NULL for the reference kernels, else a plugin every node is
 * placed on (planning fails if it declines one). */
static rlx_backend *g_backend;

/* Whether the in-tree backends take a node of op with these params: all of 1.6 but a partial
 * ROPE with frequency factors, which no model has (the reference kernels run it). */
static bool plugin_takes(uint32_t op, const rlx_op_params *p, uint32_t n_in) {
    return !(op == RLX_OP_ROPE && n_in == 3 && p->rope_dims && p->rope_dims != p->head_dim);
}

/* Runs op over inputs in[i] of role[i] (INPUT, WEIGHT or STATE; each bound to its data) and
 * returns the status; on success the out_floats values of the output are copied to out. */
static int run_node(uint32_t op, const rlx_op_params *params, const rlx_tensor *in, const rlx_tensor_role *role,
                    uint32_t n_in, float *out, size_t out_floats) {
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    int ids[MAX_INPUTS];
    for (uint32_t i = 0; i < n_in; i++) {
        char name[16];
        snprintf(name, sizeof name, "in%u", i);
        ids[i] = rlx_graph_add_tensor(g, role[i], name, (rlx_dtype)in[i].dtype, in[i].n_dims, in[i].shape,
                                      role[i] == RLX_ROLE_WEIGHT ? in[i].data : NULL);
        assert_true(ids[i] >= 0);
    }
    const int y = rlx_graph_add_node(g, (rlx_op)op, "node", ids, n_in, params);
    if (y < 0)
        fail_msg("add_node: %s", rlx_last_error());
    assert_ok(rlx_graph_mark_output(g, y));
    rlx_plan *p;
    if (g_backend && plugin_takes(op, params, n_in)) {
        const rlx_place_rule rule = {.op = op, .backend = g_backend};
        if (rlx_plan_create(g,
                            &(rlx_plan_options){.size = sizeof(rlx_plan_options),
                                                .backends = &g_backend,
                                                .n_backends = 1,
                                                .rules = &rule,
                                                .n_rules = 1},
                            &p) != RLX_OK)
            fail_msg("%s declines node: %s", rlx_backend_name(g_backend), rlx_last_error());
    } else {
        assert_ok(rlx_plan_create(g, NULL, &p));
    }
    for (uint32_t i = 0; i < n_in; i++)
        if (role[i] != RLX_ROLE_WEIGHT)
            assert_ok(rlx_plan_bind(p, ids[i], in[i].data));
    const int rc = rlx_plan_run(p);
    if (rc == RLX_OK) {
        assert_int_equal((size_t)rlx_tensor_numel(rlx_graph_tensor(g, y)), out_floats);
        memcpy(out, rlx_plan_data(p, y), out_floats * sizeof *out);
    }
    rlx_plan_destroy(p);
    rlx_graph_destroy(g);
    return rc;
}

/* Error of got against want relative to want's largest magnitude (a norm-wise relative error,
 * since single values near zero carry the absolute rounding of their larger neighbours).
 * F32 arithmetic over Dk-term dot products and a state carried over up to 150 rows (decays <=
 * 1, so older rounding shrinks) keeps this within a few F32 epsilons (measured: at most 4e-7
 * over every case, recurrent and chunked forms alike); TOL leaves 25 times that for other
 * compilers and vector widths, while a real error (a wrong decay, a skipped reset, a row of the
 * wrong slot, a chunk boundary lost) is 1e-2 or more. ROPE computes its angles in double, as
 * NumPy does, so its error is one F32 rounding. */
#define TOL 1e-5

static double max_err(const float *got, const float *want, size_t n) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]);
        worst = e > worst || isnan(e) ? e : worst;
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    return worst / (scale > 0 ? scale : 1);
}

static void run_case(reader *r) {
    hyb_case c;
    take_case_head(r, &c);
    const size_t state_bytes = c.has_state ? (size_t)rlx_tensor_numel(&c.state) * sizeof(float) : 0;
    float *before = c.has_state ? malloc(state_bytes) : NULL;
    const uint32_t n_calls = take_u32(r);
    for (uint32_t call = 0; call < n_calls; call++) {
        hyb_call k;
        take_call(r, &k, &c);
        rlx_tensor in[MAX_INPUTS];
        rlx_tensor_role role[MAX_INPUTS];
        /* the state rows, NaN until the kernel writes them: a row left unwritten shows */
        rlx_tensor rows = k.want_rows;
        const size_t n_rows = c.params.state_rows ? (size_t)rlx_tensor_numel(&rows) : 0;
        rows.data = n_rows ? malloc(n_rows * sizeof(float)) : NULL;
        for (size_t i = 0; i < n_rows; i++)
            ((float *)rows.data)[i] = NAN;
        for (uint32_t i = 0; i < k.n_inputs; i++) {
            if (k.kind[i] == K_ROWS) {
                assert_non_null(rows.data);
                in[i] = rows;
                role[i] = RLX_ROLE_STATE;
            } else if (k.kind[i] == K_ACT) {
                assert_true(k.index[i] < k.n_acts);
                in[i] = k.acts[k.index[i]];
                role[i] = RLX_ROLE_INPUT;
            } else if (k.kind[i] == K_WEIGHT) {
                assert_true(k.index[i] < c.n_weights);
                in[i] = c.weights[k.index[i]];
                role[i] = RLX_ROLE_WEIGHT;
            } else {
                assert_true(c.has_state);
                in[i] = c.state;
                role[i] = RLX_ROLE_STATE;
            }
        }
        if (before)
            memcpy(before, c.state.data, state_bytes);
        const size_t n_out = k.status == 0 ? (size_t)rlx_tensor_numel(&k.want) : 0;
        float *out = malloc(n_out ? n_out * sizeof *out : 1);
        assert_non_null(out);
        const int rc = run_node(c.op, &c.params, in, role, k.n_inputs, out, n_out);
        if (k.status != 0) {
            if (rc != k.status)
                fail_msg("%s, call %u: status %d, expected %d (%s)", c.name, call, rc, k.status, rlx_last_error());
            assert_error_mentions("node 'node'");
            if (before)
                assert_memory_equal(before, c.state.data, state_bytes);
        } else {
            if (rc != RLX_OK)
                fail_msg("%s, call %u: %s", c.name, call, rlx_last_error());
            const double e = max_err(out, k.want.data, n_out);
            if (!(e <= TOL))
                fail_msg("%s, call %u: output off by %g (relative)%s%s", c.name, call, e, g_backend ? " on " : "",
                         g_backend ? rlx_backend_name(g_backend) : "");
            const double er = n_rows ? max_err(rows.data, k.want_rows.data, n_rows) : 0;
            if (!(er <= TOL))
                fail_msg("%s, call %u: state rows off by %g (relative)%s%s", c.name, call, er, g_backend ? " on " : "",
                         g_backend ? rlx_backend_name(g_backend) : "");
        }
        free(rows.data);
        free(out);
        free_call(&k);
    }
    if (c.has_state) {
        rlx_tensor want = take_tensor(r);
        const double e = max_err(c.state.data, want.data, (size_t)rlx_tensor_numel(&want));
        if (!(e <= TOL))
            fail_msg("%s: final state off by %g (relative)", c.name, e);
        free(want.data);
        free(c.state.data);
    }
    for (uint32_t i = 0; i < c.n_weights; i++)
        free(c.weights[i].data);
    free(before);
}

static void run_cases(void) {
    size_t len = 0;
    char *buf = test_read_file(CASES, &len);
    if (!buf)
        fail_msg("cannot read %s (written by hybrid_ops_ref.py, the make_hybrid_cases test)", CASES);
    reader r = {buf, buf + len};
    char magic[8];
    take(&r, magic, 8);
    assert_memory_equal(magic, "RLXHYB3", 8);
    const uint32_t n = take_u32(&r);
    assert_true(n >= 10);
    for (uint32_t i = 0; i < n; i++)
        run_case(&r);
    assert_true(r.p == r.end);
    free(buf);
}

static const char *const in_tree[] = {"/rlx-backend-cpu-blas.so", "/rlx-backend-onednn.so"};

/* Runs body on the reference kernels, then on each in-tree backend at each ISA level this CPU
 * has (g_backend set): the kernel library's portable, AVX2 and AVX-512 instances are different
 * code (vector widths, blocking, tails). */
static void on_each_backend(void (*body)(void)) {
    static const char *const levels[] = {"isa=c", "isa=avx2", "isa=avx512"};
    body();
    int ran = 0;
    for (size_t i = 0; i < sizeof in_tree / sizeof in_tree[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s%s", RLX_BUILD_PLUGIN_DIR, in_tree[i]);
        rlx_plugin_handle *h;
        if (rlx_plugin_load(path, &h) != RLX_OK) {
            print_message("%s not built: skipped\n", in_tree[i] + 1);
            continue;
        }
        for (size_t l = 0; l < sizeof levels / sizeof levels[0]; l++) {
            const rlx_backend_options o = {.size = sizeof o, .n_threads = 2, .extra = levels[l]};
            if (rlx_backend_create(h, &o, &g_backend) != RLX_OK) { /* a level this CPU lacks */
                print_message("%s %s: %s\n", in_tree[i] + 1, levels[l], rlx_last_error());
                continue;
            }
            body();
            ran++;
            rlx_backend_destroy(g_backend);
            g_backend = NULL;
        }
        rlx_plugin_unload(h);
    }
    assert_true(ran >= 1); /* cpu-blas is always built, and isa=c runs on any CPU */
}

static void test_numpy_cases(void **state) {
    (void)state;
    on_each_backend(run_cases);
}

// ---------------------------------------------------------------------------------------------
// GATED_DELTA's two forms, and batch invariance

/* A GATED_DELTA problem of t rows: random qkv, a, b and weights; pos, seq set by the test. */
typedef struct gd_problem {
    rlx_op_params p;
    int64_t t, slots, qkv_cols;
    float *qkv, *a, *b, A[64], dt_bias[64], *state;
    int32_t *pos, *seq;
} gd_problem;

static void gd_problem_init(gd_problem *g, uint32_t hv, uint32_t hk, uint32_t dk, uint32_t dv, int64_t t, int64_t slots,
                            uint64_t seed) {
    assert_true(hv <= 64);
    g->p = (rlx_op_params){.eps = 1e-6f,
                           .scale = 1.0f / sqrtf((float)dk),
                           .head_dim = dk,
                           .n_heads = hv,
                           .n_kv_heads = hk,
                           .head_dim_v = dv};
    g->t = t;
    g->slots = slots;
    g->qkv_cols = 2 * (int64_t)hk * dk + (int64_t)hv * dv;
    g->qkv = malloc((size_t)(t * g->qkv_cols) * sizeof(float));
    g->a = malloc((size_t)(t * hv) * sizeof(float));
    g->b = malloc((size_t)(t * hv) * sizeof(float));
    g->state = calloc((size_t)(slots * hv * dk * dv), sizeof(float));
    g->pos = malloc((size_t)t * sizeof(int32_t));
    g->seq = malloc((size_t)t * sizeof(int32_t));
    assert_true(g->qkv && g->a && g->b && g->state && g->pos && g->seq);
    for (int64_t i = 0; i < t * g->qkv_cols; i++)
        g->qkv[i] = tu_uniform(&seed);
    for (int64_t i = 0; i < t * hv; i++) {
        g->a[i] = 3.0f * tu_uniform(&seed);
        g->b[i] = 3.0f * tu_uniform(&seed);
    }
    for (uint32_t h = 0; h < hv; h++) {
        g->A[h] = -expf(1.4f + 1.4f * tu_uniform(&seed)); /* -exp(A_log), A_log in [0, log 16] */
        g->dt_bias[h] = tu_uniform(&seed);
    }
}

static void gd_problem_free(gd_problem *g) {
    free(g->qkv), free(g->a), free(g->b), free(g->state), free(g->pos), free(g->seq);
}

/* Runs rows [r0, r0 + n) of g as one call into out (the problem's output rows r0 ..). */
static int gd_call(gd_problem *g, int64_t r0, int64_t n, float *out) {
    const int64_t hv = g->p.n_heads, dk = g->p.head_dim, dv = g->p.head_dim_v;
    const int slotted = g->slots > 1;
#define ACT2(ptr, cols)                                                                                                \
    { .dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, cols, 1, 1}, .data = (ptr) + r0 * (cols) }
    const rlx_tensor in[8] = {
        ACT2(g->qkv, g->qkv_cols),
        ACT2(g->a, hv),
        ACT2(g->b, hv),
        {.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {hv, 1, 1, 1}, .data = g->A},
        {.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {hv, 1, 1, 1}, .data = g->dt_bias},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {n, 1, 1, 1}, .data = g->pos + r0},
        slotted ? (rlx_tensor){.dtype = RLX_DTYPE_F32, .n_dims = 4, .shape = {g->slots, hv, dk, dv}, .data = g->state}
                : (rlx_tensor){.dtype = RLX_DTYPE_F32, .n_dims = 3, .shape = {hv, dk, dv, 1}, .data = g->state},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {n, 1, 1, 1}, .data = g->seq + r0},
    };
#undef ACT2
    const rlx_tensor_role role[8] = {RLX_ROLE_INPUT,  RLX_ROLE_INPUT, RLX_ROLE_INPUT, RLX_ROLE_WEIGHT,
                                     RLX_ROLE_WEIGHT, RLX_ROLE_INPUT, RLX_ROLE_STATE, RLX_ROLE_INPUT};
    return run_node(RLX_OP_GATED_DELTA, &g->p, in, role, 7u + (uint32_t)slotted, out + r0 * hv * dv,
                    (size_t)(n * hv * dv));
}

/* The chunk-parallel form (a call of T rows: chunks of 64 and a shorter last one) against the
 * recurrent one (calls of 8 rows, below the kernel's threshold), over the same rows from the
 * same state: outputs and final states agree to F32 rounding. T = 200 (64 + 64 + 64 + 8). */
static void chunked_matches_recurrent(void) {
    enum { T = 200, HV = 4, HK = 2, DK = 64, DV = 48, SPLIT = 8 };
    gd_problem one, rec;
    gd_problem_init(&one, HV, HK, DK, DV, T, 1, 7);
    gd_problem_init(&rec, HV, HK, DK, DV, T, 1, 7);
    for (int64_t i = 0; i < T; i++)
        one.pos[i] = rec.pos[i] = (int32_t)(i + 3);
    for (int64_t i = 0; i < HV * DK * DV; i++) /* a state to start from: position 3 is not 0 */
        one.state[i] = rec.state[i] = 0.1f * (float)((i * 7919) % 19 - 9);
    float *y1 = malloc(T * HV * DV * sizeof *y1), *y2 = malloc(T * HV * DV * sizeof *y2);
    assert_true(y1 && y2);
    assert_ok(gd_call(&one, 0, T, y1));
    for (int64_t r = 0; r < T; r += SPLIT)
        assert_ok(gd_call(&rec, r, SPLIT, y2));
    const double e_out = max_err(y1, y2, T * HV * DV), e_state = max_err(one.state, rec.state, HV * DK * DV);
    print_message("%s: chunked vs recurrent, T=%d: output %.3g, state %.3g (norm-wise relative)\n",
                  g_backend ? rlx_backend_name(g_backend) : "reference", T, e_out, e_state);
    assert_true(e_out <= TOL && e_state <= TOL);
    assert_true(e_out > 0); /* the forms differ in rounding: the chunked one did run */
    free(y1), free(y2);
    gd_problem_free(&one);
    gd_problem_free(&rec);
}

/* Slot 0's rows give the same bits alone and among rows of other slots (one of them a prompt
 * chunk of 40 rows, so the call is large enough to run on several threads while slot 0's own
 * call runs on one), and so does its state. */
static void batch_invariance(void) {
    enum { HV = 8, HK = 2, DK = 64, DV = 64, N0 = 20, T = N0 + 1 + 40 };
    gd_problem alone, mixed;
    gd_problem_init(&mixed, HV, HK, DK, DV, T, 3, 11);
    gd_problem_init(&alone, HV, HK, DK, DV, T, 3, 11);
    /* mixed: slot 0 at 0..19, slot 1 one row at 5, slot 2 at 0..39, interleaved */
    int64_t n0 = 0, n2 = 0;
    for (int64_t r = 0; r < T; r++) {
        const int32_t s = r == 9 ? 1 : r % 3 == 0 && n0 < N0 ? 0 : n2 < 40 ? 2 : 0;
        mixed.seq[r] = s;
        mixed.pos[r] = s == 1 ? 5 : s == 0 ? (int32_t)n0++ : (int32_t)n2++;
    }
    assert_int_equal(n0, N0);
    /* alone: the same slot 0 rows (same data) first, in order */
    int64_t k = 0;
    for (int64_t r = 0; r < T; r++)
        if (mixed.seq[r] == 0) {
            memcpy(alone.qkv + k * mixed.qkv_cols, mixed.qkv + r * mixed.qkv_cols,
                   (size_t)mixed.qkv_cols * sizeof(float));
            memcpy(alone.a + k * HV, mixed.a + r * HV, HV * sizeof(float));
            memcpy(alone.b + k * HV, mixed.b + r * HV, HV * sizeof(float));
            alone.pos[k] = mixed.pos[r];
            alone.seq[k++] = 0;
        }
    float *ym = malloc(T * HV * DV * sizeof *ym), *ya = malloc(T * HV * DV * sizeof *ya);
    assert_true(ym && ya);
    assert_ok(gd_call(&mixed, 0, T, ym));
    assert_ok(gd_call(&alone, 0, N0, ya));
    k = 0;
    for (int64_t r = 0; r < T; r++)
        if (mixed.seq[r] == 0)
            assert_memory_equal(ym + r * HV * DV, ya + k++ * HV * DV, HV * DV * sizeof(float));
    assert_memory_equal(mixed.state, alone.state, HV * DK * DV * sizeof(float));
    free(ym), free(ya);
    gd_problem_free(&alone);
    gd_problem_free(&mixed);
}

static void test_chunked_matches_recurrent(void **unused) {
    (void)unused;
    on_each_backend(chunked_matches_recurrent);
}

/* One run of the thread-count test: a one-sequence prompt of 150 rows (chunked: 64 + 64 + 22)
 * and then three slots interleaved (row by row), from seed's data; outputs and states. */
static void thread_run(uint64_t seed, float *y1, float *s1, float *y2, float *s2) {
    enum { HV = 6, HK = 3, DK = 40, DV = 24, T = 150 };
    gd_problem one, many;
    gd_problem_init(&one, HV, HK, DK, DV, T, 1, seed);
    gd_problem_init(&many, HV, HK, DK, DV, T, 3, seed);
    for (int32_t r = 0; r < T; r++) {
        one.pos[r] = r, one.seq[r] = 0;
        many.seq[r] = r % 3, many.pos[r] = r / 3;
    }
    assert_ok(gd_call(&one, 0, T, y1));
    assert_ok(gd_call(&many, 0, T, y2));
    memcpy(s1, one.state, HV * DK * DV * sizeof *s1);
    memcpy(s2, many.state, 3 * HV * DK * DV * sizeof *s2);
    gd_problem_free(&one);
    gd_problem_free(&many);
}

/* Every (slot, head) runs on one thread from start to end, so the in-tree backends give the same
 * bits on 1, 2 and 3 threads (3: more threads than cores, tasks handed out unevenly), many times
 * over, whatever else the machine runs. */
static void test_thread_count_invariance(void **unused) {
    (void)unused;
    enum { OUT = 150 * 6 * 24, STATE = 3 * 6 * 40 * 24, ROUNDS = 8 };
    rlx_plugin_handle *h;
    char path[512];
    snprintf(path, sizeof path, "%s%s", RLX_BUILD_PLUGIN_DIR, in_tree[0]);
    assert_ok(rlx_plugin_load(path, &h));
    float *want = calloc(2 * (OUT + STATE), sizeof *want), *got = calloc(2 * (OUT + STATE), sizeof *got);
    assert_true(want && got);
    for (uint64_t seed = 1; seed <= ROUNDS; seed++)
        for (uint32_t threads = 1; threads <= 3; threads++) {
            const rlx_backend_options o = {.size = sizeof o, .n_threads = threads};
            assert_ok(rlx_backend_create(h, &o, &g_backend));
            float *out = threads == 1 ? want : got;
            thread_run(seed, out, out + OUT, out + OUT + STATE, out + 2 * OUT + STATE);
            rlx_backend_destroy(g_backend);
            g_backend = NULL;
            if (threads > 1 && memcmp(want, got, 2 * (OUT + STATE) * sizeof *got) != 0)
                fail_msg("seed %llu: %u threads give other bits than 1", (unsigned long long)seed, threads);
        }
    free(want), free(got);
    rlx_plugin_unload(h);
}

static void test_batch_invariance(void **unused) {
    (void)unused;
    on_each_backend(batch_invariance);
}

/* cpu-blas's batch_invariant=1 runs a one-sequence prompt row by row as well (what a pipeline
 * stage's replay needs): 40 rows in one call give the bits of 40 calls of one row; without the
 * option the call takes the chunked form, whose rounding differs. */
static void test_split_invariant_option(void **unused) {
    (void)unused;
    enum { HV = 4, HK = 2, DK = 32, DV = 16, T = 40 };
    rlx_plugin_handle *h;
    char path[512];
    snprintf(path, sizeof path, "%s%s", RLX_BUILD_PLUGIN_DIR, in_tree[0]);
    assert_ok(rlx_plugin_load(path, &h));
    float *whole = malloc(T * HV * DV * sizeof *whole), *rows = malloc(T * HV * DV * sizeof *rows);
    assert_true(whole && rows);
    for (int invariant = 1; invariant >= 0; invariant--) {
        const rlx_backend_options o = {
            .size = sizeof o, .n_threads = 2, .extra = invariant ? "batch_invariant=1" : "batch_invariant=0"};
        assert_ok(rlx_backend_create(h, &o, &g_backend));
        gd_problem one, split;
        gd_problem_init(&one, HV, HK, DK, DV, T, 1, 5);
        gd_problem_init(&split, HV, HK, DK, DV, T, 1, 5);
        for (int32_t r = 0; r < T; r++)
            one.pos[r] = split.pos[r] = r, one.seq[r] = split.seq[r] = 0;
        assert_ok(gd_call(&one, 0, T, whole));
        for (int64_t r = 0; r < T; r++)
            assert_ok(gd_call(&split, r, 1, rows));
        const int same = !memcmp(whole, rows, T * HV * DV * sizeof *rows) &&
                         !memcmp(one.state, split.state, HV * DK * DV * sizeof(float));
        if (same != invariant)
            fail_msg("batch_invariant=%d: one call and %d calls of a row %s", invariant, T,
                     same ? "gave the same bits (the chunked form did not run)" : "differ");
        gd_problem_free(&one);
        gd_problem_free(&split);
        rlx_backend_destroy(g_backend);
        g_backend = NULL;
    }
    free(whole), free(rows);
    rlx_plugin_unload(h);
}

// ---------------------------------------------------------------------------------------------
// Graph validation

static int add(rlx_graph *g, rlx_tensor_role role, const char *name, rlx_dtype dt, uint32_t n_dims, int64_t d0,
               int64_t d1, int64_t d2, int64_t d3) {
    static float data[64];
    const int id = rlx_graph_add_tensor(g, role, name, dt, n_dims, (int64_t[]){d0, d1, d2, d3},
                                        role == RLX_ROLE_WEIGHT ? data : NULL);
    assert_true(id >= 0);
    return id;
}

/* add_node fails with status, its message naming the node and mentioning `what`. */
static void rejects(rlx_graph *g, rlx_op op, const int *in, uint32_t n, const rlx_op_params *p, int status,
                    const char *what) {
    const int rc = rlx_graph_add_node(g, op, "bad", in, n, p);
    if (rc != status)
        fail_msg("expected status %d mentioning '%s', got %d: %s", status, what, rc, rlx_last_error());
    assert_error_mentions("node 'bad'");
    assert_error_mentions(what);
}

static void test_gated_delta_validation(void **unused) {
    (void)unused;
    enum { T = 3, HV = 4, HK = 2, DK = 8, DV = 6 };
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    const rlx_op_params p = {
        .eps = 1e-6f, .scale = 0.3f, .head_dim = DK, .n_heads = HV, .n_kv_heads = HK, .head_dim_v = DV};
    const int qkv = add(g, RLX_ROLE_INPUT, "qkv", RLX_DTYPE_F32, 2, T, 2 * HK * DK + HV * DV, 1, 1);
    const int a = add(g, RLX_ROLE_INPUT, "a", RLX_DTYPE_F32, 2, T, HV, 1, 1);
    const int b = add(g, RLX_ROLE_INPUT, "b", RLX_DTYPE_F32, 2, T, HV, 1, 1);
    const int A = add(g, RLX_ROLE_WEIGHT, "A", RLX_DTYPE_BF16, 1, HV, 1, 1, 1);
    const int dt = add(g, RLX_ROLE_WEIGHT, "dt_bias", RLX_DTYPE_F16, 1, HV, 1, 1, 1);
    const int pos = add(g, RLX_ROLE_INPUT, "pos", RLX_DTYPE_I32, 1, T, 1, 1, 1);
    const int st = add(g, RLX_ROLE_STATE, "state", RLX_DTYPE_F32, 3, HV, DK, DV, 1);
    const int st4 = add(g, RLX_ROLE_STATE, "state4", RLX_DTYPE_F32, 4, 5, HV, DK, DV);
    const int seq = add(g, RLX_ROLE_INPUT, "seq", RLX_DTYPE_I32, 1, T, 1, 1, 1);
    /* wrong shapes and dtypes, each named; q and k of Dv wide heads would be one row short */
    const int qkv_bad = add(g, RLX_ROLE_INPUT, "qkv_bad", RLX_DTYPE_F32, 2, T, 2 * HK * DV + HV * DV, 1, 1);
    const int st_f16 = add(g, RLX_ROLE_STATE, "state_f16", RLX_DTYPE_F16, 3, HV, DK, DV, 1);
    const int st_t = add(g, RLX_ROLE_STATE, "state_t", RLX_DTYPE_F32, 3, HV, DV, DK, 1);
    const int A_bad = add(g, RLX_ROLE_WEIGHT, "A_bad", RLX_DTYPE_F32, 1, HK, 1, 1, 1);
    const int pos_bad = add(g, RLX_ROLE_INPUT, "pos_bad", RLX_DTYPE_I32, 1, T + 1, 1, 1, 1);
    const int seq_f32 = add(g, RLX_ROLE_INPUT, "seq_f32", RLX_DTYPE_F32, 1, T, 1, 1, 1);
    const int a_bad = add(g, RLX_ROLE_INPUT, "a_bad", RLX_DTYPE_F32, 2, T + 1, HV, 1, 1);

    const int ok = rlx_graph_add_node(g, RLX_OP_GATED_DELTA, "gd", (int[]){qkv, a, b, A, dt, pos, st}, 7, &p);
    assert_true(ok >= 0);
    const rlx_tensor *y = rlx_graph_tensor(g, ok);
    assert_int_equal(y->dtype, RLX_DTYPE_F32);
    assert_int_equal(y->shape[0], T);
    assert_int_equal(y->shape[1], HV * DV);
    assert_true(rlx_graph_add_node(g, RLX_OP_GATED_DELTA, "gd4", (int[]){qkv, a, b, A, dt, pos, st4, seq}, 8, &p) >= 0);
    rlx_op_params tiled = p;
    tiled.kv_tiled = 1;
    assert_true(rlx_graph_add_node(g, RLX_OP_GATED_DELTA, "gd_tiled", (int[]){qkv, a, b, A, dt, pos, st}, 7, &tiled) >=
                0);

    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv_bad, a, b, A, dt, pos, st}, 7, &p, RLX_E_SHAPE, "input 0 'qkv_bad'");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a_bad, b, A, dt, pos, st}, 7, &p, RLX_E_SHAPE, "input 1 'a_bad'");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A_bad, dt, pos, st}, 7, &p, RLX_E_SHAPE, "input 3 'A_bad'");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos_bad, st}, 7, &p, RLX_E_SHAPE, "input 5 'pos_bad'");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st_f16}, 7, &p, RLX_E_SHAPE, "input 6 'state_f16'");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st_t}, 7, &p, RLX_E_SHAPE, "[4,8,6]");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st4}, 7, &p, RLX_E_INVALID, "takes 8 inputs");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st, seq}, 8, &p, RLX_E_INVALID, "takes 7 inputs");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st4, seq_f32}, 8, &p, RLX_E_SHAPE,
            "input 7 'seq_f32'");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos}, 6, &p, RLX_E_INVALID, "needs 7");
    rlx_op_params bad = p;
    bad.n_kv_heads = 3;
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st}, 7, &bad, RLX_E_INVALID, "key heads");
    bad = p;
    bad.head_dim_v = 0;
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st}, 7, &bad, RLX_E_INVALID, "head_dim_v 0");
    bad = p;
    bad.n_heads = 1u << 20;
    bad.n_kv_heads = 1;
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st}, 7, &bad, RLX_E_INVALID, "[1, 65536]");
    bad = p;
    bad.eps = 0;
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st}, 7, &bad, RLX_E_INVALID, "eps");
    bad = p;
    bad.kv_tiled = 2;
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st}, 7, &bad, RLX_E_INVALID, "kv_tiled is 2");

    /* state rows (ABI 1.7): a last input F32[T,Hv,Dk,Dv], in both forms */
    rlx_op_params pr = p;
    pr.state_rows = 1;
    const int rows = add(g, RLX_ROLE_STATE, "rows", RLX_DTYPE_F32, 4, T, HV, DK, DV);
    const int rows_t = add(g, RLX_ROLE_STATE, "rows_t", RLX_DTYPE_F32, 4, T + 1, HV, DK, DV);
    const int rows_v = add(g, RLX_ROLE_STATE, "rows_v", RLX_DTYPE_F32, 4, T, HV, DV, DK);
    assert_true(
        rlx_graph_add_node(g, RLX_OP_GATED_DELTA, "gd_rows", (int[]){qkv, a, b, A, dt, pos, st, rows}, 8, &pr) >= 0);
    assert_true(rlx_graph_add_node(g, RLX_OP_GATED_DELTA, "gd4_rows", (int[]){qkv, a, b, A, dt, pos, st4, seq, rows}, 9,
                                   &pr) >= 0);
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st, rows_t}, 8, &pr, RLX_E_SHAPE, "input 7 'rows_t'");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st4, seq, rows_v}, 9, &pr, RLX_E_SHAPE,
            "input 8 'rows_v'");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st}, 7, &pr, RLX_E_INVALID, "takes 8 inputs");
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st, rows}, 8, &p, RLX_E_INVALID, "takes 7 inputs");
    pr.state_rows = 2;
    rejects(g, RLX_OP_GATED_DELTA, (int[]){qkv, a, b, A, dt, pos, st, rows}, 8, &pr, RLX_E_INVALID, "state_rows is 2");
    rlx_graph_destroy(g);
}

static void test_conv_rope_gate_validation(void **unused) {
    (void)unused;
    enum { T = 2, C = 12, K = 4 };
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    const int x = add(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, T, C, 1, 1);
    const int w = add(g, RLX_ROLE_WEIGHT, "w", RLX_DTYPE_BF16, 2, C, K, 1, 1);
    const int pos = add(g, RLX_ROLE_INPUT, "pos", RLX_DTYPE_I32, 1, T, 1, 1, 1);
    const int st = add(g, RLX_ROLE_STATE, "state", RLX_DTYPE_F32, 2, K - 1, C, 1, 1);
    const int st3 = add(g, RLX_ROLE_STATE, "state3", RLX_DTYPE_F32, 3, 4, K - 1, C, 1);
    const int seq = add(g, RLX_ROLE_INPUT, "seq", RLX_DTYPE_I32, 1, T, 1, 1, 1);
    const int w1 = add(g, RLX_ROLE_WEIGHT, "w1", RLX_DTYPE_F32, 2, C, 1, 1, 1);
    const int w_rows = add(g, RLX_ROLE_WEIGHT, "w_rows", RLX_DTYPE_F32, 2, C + 1, K, 1, 1);
    const int st_k = add(g, RLX_ROLE_STATE, "state_k", RLX_DTYPE_F32, 2, K, C, 1, 1);
    const int y = rlx_graph_add_node(g, RLX_OP_SSM_CONV, "conv", (int[]){x, w, pos, st}, 4, NULL);
    assert_true(y >= 0);
    assert_int_equal(rlx_graph_tensor(g, y)->shape[1], C);
    assert_true(rlx_graph_add_node(g, RLX_OP_SSM_CONV, "conv3", (int[]){x, w, pos, st3, seq}, 5, NULL) >= 0);
    rejects(g, RLX_OP_SSM_CONV, (int[]){x, w1, pos, st}, 4, NULL, RLX_E_SHAPE, "input 1 'w1'");
    rejects(g, RLX_OP_SSM_CONV, (int[]){x, w_rows, pos, st}, 4, NULL, RLX_E_SHAPE, "input 1 'w_rows'");
    rejects(g, RLX_OP_SSM_CONV, (int[]){x, w, pos, st_k}, 4, NULL, RLX_E_SHAPE, "input 3 'state_k'");
    rejects(g, RLX_OP_SSM_CONV, (int[]){x, w, pos, st3}, 4, NULL, RLX_E_INVALID, "takes 5 inputs");
    rejects(g, RLX_OP_SSM_CONV, (int[]){x, w, pos, st, seq}, 5, NULL, RLX_E_INVALID, "takes 4 inputs");
    /* state rows (ABI 1.7): a last input F32[T,K-1,C] */
    const rlx_op_params cr = {.state_rows = 1};
    const int rows = add(g, RLX_ROLE_STATE, "rows", RLX_DTYPE_F32, 3, T, K - 1, C, 1);
    const int rows_k = add(g, RLX_ROLE_STATE, "rows_k", RLX_DTYPE_F32, 3, T, K, C, 1);
    assert_true(rlx_graph_add_node(g, RLX_OP_SSM_CONV, "conv_rows", (int[]){x, w, pos, st, rows}, 5, &cr) >= 0);
    assert_true(rlx_graph_add_node(g, RLX_OP_SSM_CONV, "conv3_rows", (int[]){x, w, pos, st3, seq, rows}, 6, &cr) >= 0);
    rejects(g, RLX_OP_SSM_CONV, (int[]){x, w, pos, st, rows_k}, 5, &cr, RLX_E_SHAPE, "input 4 'rows_k'");
    rejects(g, RLX_OP_SSM_CONV, (int[]){x, w, pos, st}, 4, &cr, RLX_E_INVALID, "takes 5 inputs");

    /* partial ROPE: rope_dims even and at most head_dim; factors then rope_dims/2 */
    const int ff2 = add(g, RLX_ROLE_WEIGHT, "ff2", RLX_DTYPE_F32, 1, 2, 1, 1, 1);
    const int ff3 = add(g, RLX_ROLE_WEIGHT, "ff3", RLX_DTYPE_F32, 1, 3, 1, 1, 1);
    rlx_op_params rp = {.rope_theta = 1e4f, .head_dim = 6, .rope_dims = 4};
    assert_true(rlx_graph_add_node(g, RLX_OP_ROPE, "rope", (int[]){x, pos}, 2, &rp) >= 0);
    assert_true(rlx_graph_add_node(g, RLX_OP_ROPE, "rope_ff", (int[]){x, pos, ff2}, 3, &rp) >= 0);
    rejects(g, RLX_OP_ROPE, (int[]){x, pos, ff3}, 3, &rp, RLX_E_SHAPE, "f32[rope_dims/2]");
    rp.rope_dims = 6; /* the whole head: factors of head_dim/2 */
    assert_true(rlx_graph_add_node(g, RLX_OP_ROPE, "rope_full", (int[]){x, pos, ff3}, 3, &rp) >= 0);
    rp.rope_dims = 3;
    rejects(g, RLX_OP_ROPE, (int[]){x, pos}, 2, &rp, RLX_E_SHAPE, "rope_dims 3");
    rp.rope_dims = 8;
    rejects(g, RLX_OP_ROPE, (int[]){x, pos}, 2, &rp, RLX_E_SHAPE, "rope_dims 8");

    const int g_bad = add(g, RLX_ROLE_INPUT, "gate_bad", RLX_DTYPE_F32, 2, T, C + 1, 1, 1);
    assert_true(rlx_graph_add_node(g, RLX_OP_SIGMOID_MUL, "gate", (int[]){x, x}, 2, NULL) >= 0);
    rejects(g, RLX_OP_SIGMOID_MUL, (int[]){x, g_bad}, 2, NULL, RLX_E_SHAPE, "input 1 'gate_bad'");
    assert_string_equal(rlx_op_name(RLX_OP_SIGMOID_MUL), "sigmoid_mul");
    assert_string_equal(rlx_op_name(RLX_OP_SSM_CONV), "ssm_conv");
    assert_string_equal(rlx_op_name(RLX_OP_GATED_DELTA), "gated_delta");
    rlx_graph_destroy(g);
}

// ---------------------------------------------------------------------------------------------
// The ABI: who is asked about these nodes

/* Whether b is offered a node of op with the given inputs (data NULL, as at planning time). */
static int offered(rlx_backend *b, uint32_t op, const rlx_tensor *in, uint32_t n, const rlx_op_params *p) {
    const int64_t cols = op == RLX_OP_GATED_DELTA ? (int64_t)p->n_heads * p->head_dim_v : in[0].shape[1];
    rlx_tensor out = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {in[0].shape[0], cols, 1, 1}};
    const rlx_node_view v = {.op = op, .n_inputs = n, .inputs = in, .output = &out, .params = p, .name = "n"};
    return rlx_backend_supports(b, &v);
}

/* Which nodes b, built for ABI 1.minor, is offered: those of 1.6 from minor 6, the recurrent
 * ones with state rows from 7. An in-tree backend declines a partial ROPE with factors and shapes
 * the contract does not allow; a careless one (tests/plugins/abi13_backend.c) claims whatever it
 * is offered. */
static void check_offers(rlx_backend *b, uint32_t minor, int in_tree_backend) {
    const int take = minor >= 6, take_rows = minor >= 7, take_any = take && !in_tree_backend;
    enum { T = 2, D = 8 };
    const rlx_tensor x = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, 2 * D, 1, 1}};
    const rlx_tensor pos = {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {T, 1, 1, 1}};
    const rlx_tensor rope_in[2] = {x, pos};
    const rlx_op_params full = {.rope_theta = 1e4f, .head_dim = D},
                        whole = {.rope_theta = 1e4f, .head_dim = D, .rope_dims = D},
                        part = {.rope_theta = 1e4f, .head_dim = D, .rope_dims = 4};
    /* a whole-head ROPE is offered to all (rope_dims 0 or head_dim) */
    assert_int_equal(offered(b, RLX_OP_ROPE, rope_in, 2, &full), 1);
    assert_int_equal(offered(b, RLX_OP_ROPE, rope_in, 2, &whole), 1);
    assert_int_equal(offered(b, RLX_OP_ROPE, rope_in, 2, &part), take);
    const rlx_tensor factors = {.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {D / 2, 1, 1, 1}};
    const rlx_tensor rope_ff[3] = {x, pos, factors};
    assert_int_equal(offered(b, RLX_OP_ROPE, rope_ff, 3, &part), take_any);
    const rlx_tensor two[2] = {x, x};
    assert_int_equal(offered(b, RLX_OP_ADD, two, 2, &full), 1);
    assert_int_equal(offered(b, RLX_OP_SIGMOID_MUL, two, 2, &full), take);
    const rlx_tensor conv_in[4] = {x,
                                   {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {2 * D, 4, 1, 1}},
                                   pos,
                                   {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {3, 2 * D, 1, 1}}};
    assert_int_equal(offered(b, RLX_OP_SSM_CONV, conv_in, 4, &full), take);
    const rlx_op_params conv_rows_p = {.state_rows = 1};
    const rlx_tensor conv_rows[5] = {conv_in[0],
                                     conv_in[1],
                                     conv_in[2],
                                     conv_in[3],
                                     {.dtype = RLX_DTYPE_F32, .n_dims = 3, .shape = {T, 3, 2 * D, 1}}};
    assert_int_equal(offered(b, RLX_OP_SSM_CONV, conv_rows, 5, &conv_rows_p), take_rows);
    const rlx_op_params gp = {.eps = 1e-6f, .head_dim = D, .n_heads = 2, .n_kv_heads = 2, .head_dim_v = D};
    const rlx_tensor ab = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, 2, 1, 1}},
                     w = {.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {2, 1, 1, 1}};
    const rlx_tensor qkv = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, 6 * D, 1, 1}};
    const rlx_tensor gd_in[7] = {qkv, ab, ab, w, w, pos, {.dtype = RLX_DTYPE_F32, .n_dims = 3, .shape = {2, D, D, 1}}};
    assert_int_equal(offered(b, RLX_OP_GATED_DELTA, gd_in, 7, &gp), take);
    rlx_op_params gp_rows = gp;
    gp_rows.state_rows = 1;
    const rlx_tensor gd_rows[8] = {
        gd_in[0], gd_in[1], gd_in[2], gd_in[3],
        gd_in[4], gd_in[5], gd_in[6], {.dtype = RLX_DTYPE_F32, .n_dims = 4, .shape = {T, 2, D, D}}};
    assert_int_equal(offered(b, RLX_OP_GATED_DELTA, gd_rows, 8, &gp_rows), take_rows);
    /* state rows of the wrong row count are declined */
    const rlx_tensor gd_rows_bad[8] = {
        gd_in[0], gd_in[1], gd_in[2], gd_in[3],
        gd_in[4], gd_in[5], gd_in[6], {.dtype = RLX_DTYPE_F32, .n_dims = 4, .shape = {T + 1, 2, D, D}}};
    assert_int_equal(offered(b, RLX_OP_GATED_DELTA, gd_rows_bad, 8, &gp_rows), take_rows && !in_tree_backend);
    /* a shape the contract does not allow is declined: a state of the wrong Dv */
    const rlx_tensor bad_in[7] = {qkv, ab, ab, w, w, pos, {.dtype = RLX_DTYPE_F32, .n_dims = 3, .shape = {2, D, 4, 1}}};
    assert_int_equal(offered(b, RLX_OP_GATED_DELTA, bad_in, 7, &gp), take_any);
}

/* A backend built for 1.3 that claims every node is never asked about the ops of 1.6 nor a
 * partial ROPE (the reference kernels run them there), the same built for 1.6 not about state
 * rows; the in-tree backends, built for this ABI, take them all. */
static void test_abi_offers(void **unused) {
    (void)unused;
    rlx_plugin_handle *h;
    rlx_backend *b;
    const char *const careless[] = {RLX_TEST_ABI13, RLX_TEST_ABI16};
    for (uint32_t i = 0; i < 2; i++) {
        assert_ok(rlx_plugin_load(careless[i], &h));
        assert_ok(rlx_backend_create(h, NULL, &b));
        assert_int_equal(rlx_backend_abi_minor(b), i ? 6 : 3);
        check_offers(b, rlx_backend_abi_minor(b), 0);
        rlx_backend_destroy(b);
        rlx_plugin_unload(h);
    }
    for (size_t i = 0; i < sizeof in_tree / sizeof in_tree[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s%s", RLX_BUILD_PLUGIN_DIR, in_tree[i]);
        if (rlx_plugin_load(path, &h) != RLX_OK) {
            print_message("%s not built: skipped\n", in_tree[i] + 1);
            continue;
        }
        assert_ok(rlx_backend_create(h, NULL, &b));
        assert_int_equal(rlx_backend_abi_minor(b), RLX_ABI_MINOR);
        check_offers(b, RLX_ABI_MINOR, 1);
        rlx_backend_destroy(b);
        rlx_plugin_unload(h);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numpy_cases),
        cmocka_unit_test(test_chunked_matches_recurrent),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_thread_count_invariance),
        cmocka_unit_test(test_split_invariant_option),
        cmocka_unit_test(test_gated_delta_validation),
        cmocka_unit_test(test_conv_rope_gate_validation),
        cmocka_unit_test(test_abi_offers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
