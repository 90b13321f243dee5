/* ATTENTION over Q8_0 KV caches (ABI 1.8) in the CPU kernel library, at every ISA level this CPU
 * runs, against references written here from the definition of the format, not from the
 * library's code:
 *   - a row written to the cache is llama.cpp's x86 Q8_0 of it (per block of 32: d = amax / 127
 *     as F16, q = x * (127 / amax) rounded to nearest even), byte for byte;
 *   - each output is the double-precision attention over the stored values d * q (so to F32
 *     rounding), and within the bound Q8_0's rounding allows of the attention over the values
 *     before quantization;
 *   - a row's output has the same bits alone as in a batch of other slots' rows and prompt rows
 *     (the decode and the many-query shapes of the kernel). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"
#include "quant_host.h"
#include "testutil.h"

/* tasks from the last, as two "threads" in turn */
static void tasks_reversed(void *self, int64_t n, int64_t work, kern_range_fn fn, void *ctx) {
    (void)self, (void)work;
    for (int64_t i = n - 1; i >= 0; i--)
        fn(ctx, (int)(i % 2), i, i + 1);
}

static const kern_par one = {.n_threads = 1, .parallel_for = quant_serial_for, .parallel_tasks = quant_serial_tasks};
static const kern_par two = {.n_threads = 2, .parallel_for = quant_serial_for, .parallel_tasks = tasks_reversed};

enum { D = 64, HQ = 4, HKV = 2, KV = HKV * D, SLOTS = 2, C = 300, QK = 32, BLOCK_BYTES = 2 + QK };
static const float SCALE = 0.125f;

/* The q, k and v of the row at (slot, pos), the same in any call; k and v also fill the cache
 * rows before a test, so every cached value has its unquantized original. Values of 4 * [-1, 1)
 * with a few large ones, so blocks have different scales. */
static void row_of(int slot, int pos, float *q, float *k, float *v) {
    uint64_t s = 7919u * (uint64_t)slot + (uint64_t)pos + 1u;
    tu_fill(q, HQ * D, &s);
    tu_fill(k, KV, &s);
    tu_fill(v, KV, &s);
    for (int i = 0; i < KV; i++) {
        k[i] *= (i / QK) % 3 == 0 ? 4.0f : 1.0f;
        v[i] *= (i / QK) % 3 == 1 ? 4.0f : 1.0f;
    }
}

/* x[32] quantized as the format defines it, into the 34 bytes b: F16 d (little-endian), then
 * the 32 signed q. */
static void define_q8_0(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int i = 0; i < QK; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const uint16_t d = rlx_iface_f32_to_f16(amax / 127.0f);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    b[0] = (uint8_t)(d & 0xff);
    b[1] = (uint8_t)(d >> 8);
    for (int i = 0; i < QK; i++)
        b[2 + i] = (uint8_t)(int8_t)nearbyintf(x[i] * id);
}

/* Value i of a row of Q8_0 blocks: d * q. */
static double value_of(const uint8_t *row, int i) {
    const uint8_t *b = row + (i / QK) * BLOCK_BYTES;
    return (double)rlx_iface_f16_to_f32((uint16_t)(b[0] | b[1] << 8)) * (int8_t)b[2 + i % QK];
}

static size_t row_at(int slot, int pos) { return ((size_t)slot * C + (size_t)pos) * (KV / QK) * BLOCK_BYTES; }

/* Caches whose every row holds row_of's k (or v) quantized. */
static void fill_caches(uint8_t *kc, uint8_t *vc) {
    float q[HQ * D], k[KV], v[KV];
    for (int s = 0; s < SLOTS; s++)
        for (int p = 0; p < C; p++) {
            row_of(s, p, q, k, v);
            for (int b = 0; b < KV / QK; b++) {
                define_q8_0(k + b * QK, kc + row_at(s, p) + (size_t)b * BLOCK_BYTES);
                define_q8_0(v + b * QK, vc + row_at(s, p) + (size_t)b * BLOCK_BYTES);
            }
        }
}

static size_t cache_bytes(void) { return (size_t)SLOTS * C * (KV / QK) * BLOCK_BYTES; }

static int attend(kern_ctx *c, const int32_t *seq, const int32_t *pos, int64_t n, uint32_t window, void *kc, void *vc,
                  float *out) {
    float *q = malloc((size_t)n * HQ * D * sizeof *q), *k = malloc((size_t)n * KV * sizeof *k),
          *v = malloc((size_t)n * KV * sizeof *v);
    assert_non_null(q), assert_non_null(k), assert_non_null(v);
    for (int64_t t = 0; t < n; t++)
        row_of(seq[t], pos[t], q + t * HQ * D, k + t * KV, v + t * KV);
    const rlx_op_params p = {.scale = SCALE, .head_dim = D, .n_heads = HQ, .n_kv_heads = HKV, .window = window};
    rlx_tensor in[7] = {
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, HQ * D, 1, 1}, .data = q},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, KV, 1, 1}, .data = k},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, KV, 1, 1}, .data = v},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {n, 1, 1, 1}, .data = (void *)pos},
        {.dtype = RLX_DTYPE_Q8_0, .n_dims = 3, .shape = {SLOTS, C, KV, 1}, .data = kc},
        {.dtype = RLX_DTYPE_Q8_0, .n_dims = 3, .shape = {SLOTS, C, KV, 1}, .data = vc},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {n, 1, 1, 1}, .data = (void *)seq},
    };
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, HQ * D, 1, 1}, .data = out};
    const rlx_node_view node = {
        .op = RLX_OP_ATTENTION, .n_inputs = 7, .inputs = in, .output = &o, .params = &p, .name = "att"};
    const int rc = kern_op_attention(c, &node);
    free(q), free(k), free(v);
    return rc;
}

/* The query at (slot, pos) over keys [lo, pos] in double: over the cache's stored values
 * (stored) or over the values before quantization (original, with the query's own row among
 * them); bound[h] is then what Q8_0's rounding may move head h's outputs by (see below). */
static void reference(const uint8_t *kc, const uint8_t *vc, int slot, int pos, int lo, int stored, double *out,
                      double *bound) {
    float q[HQ * D], k[KV], v[KV];
    row_of(slot, pos, q, k, v);
    static double s[C], kk[C][KV], vv[C][KV], err_k[C][KV / QK], err_v[C][KV / QK], vmax[HKV];
    memset(vmax, 0, sizeof vmax);
    for (int j = lo; j <= pos; j++) {
        float qj[HQ * D], kj[KV], vj[KV];
        row_of(slot, j, qj, kj, vj);
        for (int i = 0; i < KV; i++) {
            kk[j][i] = stored ? value_of(kc + row_at(slot, j), i) : kj[i];
            vv[j][i] = stored ? value_of(vc + row_at(slot, j), i) : vj[i];
            vmax[i / D] = fmax(vmax[i / D], fabs(vv[j][i]));
        }
        /* a block's values move by at most half a step d = amax / 127, plus |q| <= 127 times
         * the F16 rounding of d (relative 2^-11): amax (1/254 + 2^-11) */
        for (int b = 0; b < KV / QK; b++) {
            double ak = 0, av = 0;
            for (int i = b * QK; i < (b + 1) * QK; i++)
                ak = fmax(ak, fabs(kj[i])), av = fmax(av, fabs(vj[i]));
            err_k[j][b] = ak * (1.0 / 254 + 0x1p-11);
            err_v[j][b] = av * (1.0 / 254 + 0x1p-11);
        }
    }
    for (int h = 0; h < HQ; h++) {
        const int kvh = h / (HQ / HKV);
        double mx = -INFINITY, sum = 0, ds = 0, dv = 0;
        for (int j = lo; j <= pos; j++) {
            double dot = 0, e = 0;
            for (int i = 0; i < D; i++) {
                dot += (double)q[h * D + i] * kk[j][kvh * D + i];
                e += fabs(q[h * D + i]) * err_k[j][(kvh * D + i) / QK];
            }
            s[j] = dot * SCALE;
            ds = fmax(ds, e * SCALE);
            mx = fmax(mx, s[j]);
            for (int i = 0; i < D; i++)
                dv = fmax(dv, err_v[j][(kvh * D + i) / QK]);
        }
        for (int j = lo; j <= pos; j++)
            sum += s[j] = exp(s[j] - mx);
        for (int i = 0; i < D; i++) {
            double acc = 0;
            for (int j = lo; j <= pos; j++)
                acc += s[j] * vv[j][kvh * D + i];
            out[h * D + i] = acc / sum;
        }
        /* scores off by at most ds move each weight by a factor within e^(+-2 ds), so the
         * weights' total change is at most e^(2 ds) - 1, times the largest value; the values
         * themselves move by at most dv */
        bound[h] = dv + vmax[kvh] * (exp(2 * ds) - 1);
    }
}

/* Slot 0's prompt rows 40..59 (a 16-row block and a 4-row one, crossing a chunk boundary), a
 * decode row of slot 1 deep in its cache, and a two-row block of slot 1 (the decode shape). */
enum { BATCH = 23 };
static const int32_t batch_seq[BATCH] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1};
static const int32_t batch_pos[BATCH] = {40, 41, 42, 43, 44,  45, 46, 47, 48, 49,  50, 51,
                                         52, 53, 54, 55, 150, 56, 57, 58, 59, 290, 291};

static void test_q8_0_cache_rows_outputs_and_bounds(void **state) {
    (void)state;
    uint8_t *kc = malloc(cache_bytes()), *vc = malloc(cache_bytes()), *want = malloc(2 * cache_bytes());
    assert_non_null(kc), assert_non_null(vc), assert_non_null(want);
    for (int l = 0; l <= (int)plugin_isa_best(); l++)
        for (uint32_t window = 0; window <= 70; window += 70) {
            const char *isa = plugin_isa_name((plugin_isa)l);
            static float out[BATCH * HQ * D];
            kern_ctx c;
            assert_ok(kern_init(&c, &quant_host, "test", isa, two));
            fill_caches(kc, vc);
            /* fill_caches wrote every row as defined; the rows the call writes are spoiled
             * first, so it must write them back to the same bytes */
            memcpy(want, kc, cache_bytes());
            memcpy(want + cache_bytes(), vc, cache_bytes());
            for (int t = 0; t < BATCH; t++) { /* rows the call writes */
                memset(kc + row_at(batch_seq[t], batch_pos[t]), 0x55, (KV / QK) * BLOCK_BYTES);
                memset(vc + row_at(batch_seq[t], batch_pos[t]), 0x55, (KV / QK) * BLOCK_BYTES);
            }
            assert_ok(attend(&c, batch_seq, batch_pos, BATCH, window, kc, vc, out));
            if (memcmp(kc, want, cache_bytes()) != 0 || memcmp(vc, want + cache_bytes(), cache_bytes()) != 0)
                fail_msg("%s: the K and V rows written are not Q8_0 as defined", isa);
            double worst_ratio = 0;
            for (int t = 0; t < BATCH; t++) {
                const int pos = batch_pos[t], lo = window && pos >= (int)window ? pos - (int)window + 1 : 0;
                double ref[HQ * D], orig[HQ * D], bound[HQ], unused[HQ];
                reference(kc, vc, batch_seq[t], pos, lo, 1, ref, unused);
                reference(kc, vc, batch_seq[t], pos, lo, 0, orig, bound);
                for (int i = 0; i < HQ * D; i++) {
                    const double got = out[t * HQ * D + i];
                    if (fabs(got - ref[i]) > 2e-5)
                        fail_msg("%s window %u: row %d value %d is %.9g, over the stored values %.9g", isa, window, t,
                                 i, got, ref[i]);
                    if (fabs(got - orig[i]) > bound[i / D] + 2e-5)
                        fail_msg("%s window %u: row %d value %d is %.9g, %.3g from the unquantized %.9g (bound %.3g)",
                                 isa, window, t, i, got, fabs(got - orig[i]), orig[i], bound[i / D]);
                    worst_ratio = fmax(worst_ratio, fabs(got - orig[i]) / bound[i / D]);
                }
            }
            /* the bound is not vacuous: Q8_0 moves the outputs by a visible part of it */
            assert_true(worst_ratio > 0.01);
            kern_deinit(&c);
        }
    free(kc), free(vc), free(want);
}

static void test_q8_0_rows_do_not_depend_on_the_batch(void **state) {
    (void)state;
    uint8_t *kc = malloc(cache_bytes()), *vc = malloc(cache_bytes()), *kc2 = malloc(cache_bytes()),
            *vc2 = malloc(cache_bytes());
    assert_non_null(kc), assert_non_null(vc), assert_non_null(kc2), assert_non_null(vc2);
    for (int l = 0; l <= (int)plugin_isa_best(); l++) {
        const char *isa = plugin_isa_name((plugin_isa)l);
        static float batch[BATCH * HQ * D], alone[HQ * D];
        kern_ctx c1, c2;
        assert_ok(kern_init(&c1, &quant_host, "test", isa, one));
        assert_ok(kern_init(&c2, &quant_host, "test", isa, two));
        fill_caches(kc, vc);
        fill_caches(kc2, vc2);
        assert_ok(attend(&c2, batch_seq, batch_pos, BATCH, 0, kc, vc, batch));
        for (int t = 0; t < BATCH; t++) { /* alone, each after the rows before it */
            assert_ok(attend(&c1, batch_seq + t, batch_pos + t, 1, 0, kc2, vc2, alone));
            if (memcmp(alone, batch + t * HQ * D, sizeof alone) != 0)
                fail_msg("%s: row %d (slot %d at %d) alone differs from the batch", isa, t, batch_seq[t], batch_pos[t]);
        }
        assert_memory_equal(vc, vc2, cache_bytes());
        kern_deinit(&c1);
        kern_deinit(&c2);
    }
    free(kc), free(vc), free(kc2), free(vc2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_0_cache_rows_outputs_and_bounds),
        cmocka_unit_test(test_q8_0_rows_do_not_depend_on_the_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
