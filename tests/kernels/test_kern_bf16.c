/* BF16 matmuls on BF16 dot products (plugins/kernels/kern_bf16.h), at both levels the CPU has
 * (avx512_bf16: VDPBF16PS; amx: AMX tiles), against references written here from the arithmetic
 * the levels promise (RLX_PRECISION_BF16_ACT), not from the kernels:
 *   - every output is the double-precision sum of bf16(x) * w within the F32 summation bound
 *     (K ulps of sum |bf16(x) w|), for shapes that leave every remainder of the tiles (M, N, K not
 *     multiples of 16, 16 and 32; odd K), with and without a bias, on a copy made at prepare time
 *     and on one made for a single call;
 *   - a row's output has the same bits alone as in any batch, and whatever the cut of the output
 *     features among threads (two real pool threads, each loading its own tile configuration);
 *   - the copy is the same for both levels and both kernels read it;
 *   - the copy made in pieces is the copy made at once, and it is shared by the uses of a tensor;
 *   - outputs are written exactly where they belong: y ends at a guard page, and the values around
 *     the written columns are left alone.
 * A level this CPU lacks is refused by name, which is what the test then checks of it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kern.h"
#include "quant_host.h"
#include "testutil.h"

static const kern_par serial = {.n_threads = 1, .parallel_for = quant_serial_for, .parallel_tasks = quant_serial_tasks};

/* The BF16 levels, lowest first. */
static const plugin_isa bf16_levels[] = {PLUGIN_ISA_AVX512_BF16, PLUGIN_ISA_AMX};
#define N_LEVELS (sizeof bf16_levels / sizeof bf16_levels[0])

/* Whether this CPU runs level l; says so when it does not. */
static bool runs(plugin_isa l) {
    if (plugin_isa_best() >= l)
        return true;
    printf("level %s not run: this CPU (or its kernel) lacks it\n", plugin_isa_name(l));
    return false;
}

typedef struct bf16_case {
    int64_t M, K, N;
    float *x, *bias;
    uint16_t *w;
    rlx_tensor t;
} bf16_case;

static void case_make(bf16_case *c, int64_t M, int64_t K, int64_t N, uint64_t seed) {
    *c = (bf16_case){.M = M, .K = K, .N = N};
    c->x = malloc((size_t)(M * K) * sizeof(float));
    c->bias = malloc((size_t)N * sizeof(float));
    c->w = malloc((size_t)(N * K) * sizeof(uint16_t));
    assert_non_null(c->x);
    assert_non_null(c->bias);
    assert_non_null(c->w);
    uint64_t s = seed;
    tu_fill(c->x, M * K, &s);
    tu_fill(c->bias, N, &s);
    for (int64_t i = 0; i < N * K; i++)
        c->w[i] = rlx_iface_f32_to_bf16(tu_uniform(&s) * (i % 7 == 0 ? 8.0f : 1.0f));
    c->t = (rlx_tensor){.dtype = RLX_DTYPE_BF16, .n_dims = 2, .shape = {N, K}, .data = c->w};
}

static void case_free(bf16_case *c) {
    free(c->x);
    free(c->bias);
    free(c->w);
}

static rlx_weight_info weight_of(const bf16_case *c) {
    return (rlx_weight_info){
        .size = sizeof(rlx_weight_info), .tensor = &c->t, .name = "w", .op = RLX_OP_MATMUL, .input = 1};
}

/* Every y[m][n] within K ulps of sum |p| of the double sum of its products p = bf16(x) w. */
static void expect_bf16_sums(const bf16_case *c, const float *y, bool bias) {
    for (int64_t m = 0; m < c->M; m++)
        for (int64_t n = 0; n < c->N; n++) {
            double sum = 0.0, mag = 0.0;
            for (int64_t k = 0; k < c->K; k++) {
                const double p = (double)rlx_iface_bf16_to_f32(rlx_iface_f32_to_bf16(c->x[m * c->K + k])) *
                                 rlx_iface_bf16_to_f32(c->w[n * c->K + k]);
                sum += p;
                mag += fabs(p);
            }
            if (bias) {
                sum += c->bias[n];
                mag += fabs(c->bias[n]);
            }
            const double err = fabs(y[m * c->N + n] - sum), bound = (double)(c->K + 2) * 0x1p-24 * mag + 1e-30;
            if (err > bound)
                fail_msg("M %lld K %lld N %lld: y[%lld][%lld] = %.9g, the sum is %.9g (error %.3g > %.3g)",
                         (long long)c->M, (long long)c->K, (long long)c->N, (long long)m, (long long)n,
                         (double)y[m * c->N + n], sum, err, bound);
        }
}

/* The sums at one level. */
static void check_sums(plugin_isa level) {
    kern_ctx k;
    static const int64_t shapes[][3] = {{1, 32, 16},  {1, 37, 29},   {2, 1, 3},     {5, 64, 48},  {16, 96, 32},
                                        {17, 96, 33}, {33, 130, 70}, {70, 300, 29}, {11, 64, 200}};
    assert_ok(kern_init(&k, &quant_host, "test", plugin_isa_name(level), serial));
    const kern_bf16_part_fn part = level == PLUGIN_ISA_AMX ? kern_bf16_part_amx : kern_bf16_part_dp;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        bf16_case c;
        case_make(&c, shapes[i][0], shapes[i][1], shapes[i][2], 100 + i);
        void *map;
        size_t len;
        float *y = tu_before_guard((size_t)(c.M * c.N) * sizeof(float), &map, &len);
        /* a copy for this call alone, then the one prepare_weight makes */
        assert_ok(kern_bf16_matmul(&k, c.x, c.M, &c.t, NULL, NULL, y));
        expect_bf16_sums(&c, y, false);
        const rlx_weight_info wi = weight_of(&c);
        assert_true(kern_bf16_use(&k, &wi));
        void *h;
        assert_ok(kern_prepare_bf16(&k, &wi, false, &h));
        assert_non_null(kern_as_bf16(h));
        assert_null(kern_as_qrp(h));
        assert_ok(kern_bf16_matmul(&k, c.x, c.M, &c.t, kern_as_bf16(h), c.bias, y));
        expect_bf16_sums(&c, y, true);
        /* the kernel itself over features [16, 32 + N % 16): nothing outside them is written */
        if (c.N > 32) {
            const int64_t Kp = kern_bf16_kp(c.K), Mp = (c.M + 15) / 16 * 16, n1 = 32 + c.N % 16;
            uint16_t *xb = calloc((size_t)(Mp * Kp), sizeof(uint16_t));
            assert_non_null(xb);
            for (int64_t m = 0; m < c.M; m++)
                for (int64_t kk = 0; kk < c.K; kk++)
                    xb[m * Kp + kk] = rlx_iface_f32_to_bf16(c.x[m * c.K + kk]);
            float *out = malloc((size_t)(c.M * c.N) * sizeof(float));
            assert_non_null(out);
            for (int64_t j = 0; j < c.M * c.N; j++)
                out[j] = -7.0f;
            part(kern_as_bf16(h)->data, c.K, xb, c.M, 16, n1, out, c.N);
            for (int64_t m = 0; m < c.M; m++)
                for (int64_t n = 0; n < c.N; n++) {
                    const bool inside = n >= 16 && n < n1;
                    const float want = inside ? y[m * c.N + n] - c.bias[n] : -7.0f;
                    if (inside ? fabsf(out[m * c.N + n] - want) > 1e-5f * (1.0f + fabsf(want))
                               : out[m * c.N + n] != want)
                        fail_msg("%s part over [16, %lld): y[%lld][%lld] = %g, not %g", plugin_isa_name(level),
                                 (long long)n1, (long long)m, (long long)n, (double)out[m * c.N + n], (double)want);
                }
            free(out);
            free(xb);
        }
        kern_release_qrp(&k, h);
        munmap(map, len);
        case_free(&c);
    }
    kern_deinit(&k);
}

static void test_bf16_levels_give_the_bf16_sums(void **state) {
    (void)state;
    for (size_t l = 0; l < N_LEVELS; l++) {
        if (runs(bf16_levels[l])) {
            check_sums(bf16_levels[l]);
        } else {
            kern_ctx k;
            assert_int_equal(kern_init(&k, &quant_host, "test", plugin_isa_name(bf16_levels[l]), serial),
                             RLX_E_UNSUPPORTED);
            kern_deinit(&k);
        }
    }
}

/* Each row of a 70-row batch, cut among two pool threads, has the bits it has alone on one. */
static void check_rows(plugin_isa level) {
    quant_pool pool;
    assert_int_equal(quant_pool_start(&pool, 2), 0);
    kern_ctx one, two;
    assert_ok(kern_init(&one, &quant_host, "test", plugin_isa_name(level), serial));
    assert_ok(kern_init(&two, &quant_host, "test", plugin_isa_name(level), quant_pool_par(&pool)));
    /* the AMX level keeps few rows on its tiles only when asked (else VDPBF16PS takes them) */
    one.batch_invariant = two.batch_invariant = true;
    bf16_case c;
    case_make(&c, 70, 1000, 520, 7);
    float *batch = malloc((size_t)(c.M * c.N) * sizeof(float)), *alone = malloc((size_t)c.N * sizeof(float));
    assert_non_null(batch);
    assert_non_null(alone);
    const rlx_weight_info wi = weight_of(&c);
    void *h;
    assert_ok(kern_prepare_bf16(&two, &wi, false, &h));
    assert_ok(kern_bf16_matmul(&two, c.x, c.M, &c.t, kern_as_bf16(h), c.bias, batch));
    for (int64_t m = 0; m < c.M; m++) {
        assert_ok(kern_bf16_matmul(&one, c.x + m * c.K, 1, &c.t, NULL, c.bias, alone));
        if (memcmp(alone, batch + m * c.N, (size_t)c.N * sizeof(float)))
            fail_msg("%s: row %lld differs between the batch and alone", plugin_isa_name(level), (long long)m);
    }
    kern_release_qrp(&two, h);
    free(batch);
    free(alone);
    case_free(&c);
    kern_deinit(&one);
    kern_deinit(&two);
    plugin_pool_destroy(pool.pool);
}

static void test_bf16_rows_do_not_depend_on_the_batch(void **state) {
    (void)state;
    for (size_t l = 0; l < N_LEVELS; l++)
        if (runs(bf16_levels[l]))
            check_rows(bf16_levels[l]);
}

/* The copy is the same bytes made at once or group by group, pads with zeros, and is shared by
 * the uses of one tensor; a use that is not a 2-D BF16 MATMUL or expert weight is not the level's. */
static void test_bf16_copy_is_made_in_pieces_and_shared(void **state) {
    (void)state;
    bf16_case c;
    case_make(&c, 1, 45, 37, 3);
    const int64_t G = kern_bf16_groups(c.N);
    const size_t bytes = kern_bf16_bytes(c.N, c.K);
    assert_int_equal(bytes, (size_t)3 * 16 * 64 * sizeof(uint16_t));
    uint16_t *whole = calloc(1, bytes), *pieces = malloc(bytes);
    assert_non_null(whole);
    assert_non_null(pieces);
    memset(pieces, 0xab, bytes);
    kern_bf16_pack(c.w, c.N, c.K, 0, G, whole);
    for (int64_t g = G - 1; g >= 0; g--)
        kern_bf16_pack(c.w, c.N, c.K, g, g + 1, pieces);
    assert_memory_equal(whole, pieces, bytes);
    /* value (n, k) sits in group n / 16, tile k / 32, row k % 32 / 2, pair n % 16, half k % 2 */
    for (int64_t n = 0; n < G * 16; n++)
        for (int64_t k = 0; k < 64; k++) {
            const size_t at = (size_t)(n / 16) * 16 * 64 + (size_t)(k / 32) * 512 + (size_t)(k % 32 / 2) * 32 +
                              (size_t)(n % 16) * 2 + (size_t)(k % 2);
            const uint16_t want = n < c.N && k < c.K ? c.w[n * c.K + k] : 0;
            if (whole[at] != want)
                fail_msg("value (%lld, %lld) of the copy is %#x, not %#x", (long long)n, (long long)k, whole[at], want);
        }
    free(whole);
    free(pieces);
    if (runs(PLUGIN_ISA_AVX512_BF16)) {
        kern_ctx k;
        assert_ok(kern_init(&k, &quant_host, "test", "avx512_bf16", serial));
        rlx_weight_info wi = weight_of(&c);
        void *a, *b;
        assert_ok(kern_prepare_bf16(&k, &wi, false, &a));
        assert_ok(kern_prepare_bf16(&k, &wi, false, &b));
        assert_ptr_equal(a, b);
        kern_release_qrp(&k, a);
        kern_release_qrp(&k, b);
        wi.op = RLX_OP_MOE; /* input 1, the router: exact */
        assert_false(kern_bf16_use(&k, &wi));
        wi.input = 2; /* an expert's weight */
        assert_true(kern_bf16_use(&k, &wi));
        wi.input = 1;
        wi.op = RLX_OP_MATMUL;
        c.t.dtype = RLX_DTYPE_F16;
        assert_false(kern_bf16_use(&k, &wi));
        kern_deinit(&k);
        /* below the level, no use is AMX's */
        assert_ok(kern_init(&k, &quant_host, "test", "avx512", serial));
        c.t.dtype = RLX_DTYPE_BF16;
        assert_false(kern_bf16_use(&k, &wi));
        kern_deinit(&k);
    }
    case_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_levels_give_the_bf16_sums),
        cmocka_unit_test(test_bf16_rows_do_not_depend_on_the_batch),
        cmocka_unit_test(test_bf16_copy_is_made_in_pieces_and_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
