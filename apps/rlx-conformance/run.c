/* The worker side of the kit: loads the backend, runs one check and judges it. An op check
 * asks supports() at planning time (data pointers NULL, as the scheduler does), then runs the
 * node and checks, in order: the returned status, that nothing was written past the output or
 * into an input, that the whole output was written, that it is finite, that ATTENTION wrote
 * the cache rows, and the largest difference from the expectation. The recurrent ops run as
 * several calls over one state, checked after each (judge_calls). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit.h"
#include "rlx/quant_iface.h"

#define GUARD_BYTES 256
#define MARKER_BITS 0x7fc5a5a5u /* a quiet NaN no arithmetic produces: "never written" */
#define KEEP_BUDGET ((size_t)512 << 20)

struct kit_runner {
    const kit_options *o;
    rlx_registry *registry;
    rlx_plugin_handle *plugin;
    rlx_backend *tested; /* the reference backend itself with --plugin ref */
    rlx_backend *ref;
    rlx_backend *ref_bf16; /* the reference kernels emulating BF16 activations (act=bf16) */
    /* Weights the tested instance has seen: it may keep their pointers until close() (repacked
     * copies keyed by pointer), so they are freed only after the instance is closed. */
    void **kept;
    size_t n_kept, cap_kept, kept_bytes;
    char describe[1200];
    void (*phase)(void *ctx, const char *phase);
    void *phase_ctx;
};

void kit_runner_on_phase(kit_runner *r, void (*fn)(void *ctx, const char *phase), void *ctx) {
    r->phase = fn;
    r->phase_ctx = ctx;
}

static void phase(kit_runner *r, const char *what) {
    if (r->phase)
        r->phase(r->phase_ctx, what);
}

static int open_tested(kit_runner *r, rlx_backend **out) {
    rlx_backend_options bo = rlx_backend_options_default();
    bo.n_threads = r->o->threads;
    bo.extra = r->o->backend_opts;
    return r->o->builtin_ref ? rlx_backend_create_ref_opts(&bo, out) : rlx_backend_create(r->plugin, &bo, out);
}

typedef struct failed_files {
    char text[2048];
    size_t len;
} failed_files;

static int collect_failures(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error) {
    failed_files *f = ctx;
    if (!h && f->len < sizeof f->text)
        f->len += (size_t)snprintf(f->text + f->len, sizeof f->text - f->len, "\n    %s", error);
    return 0;
}

int kit_runner_open(const kit_options *o, kit_runner **out, char *why, size_t why_len) {
    *out = NULL;
    kit_runner *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    r->o = o;
    if (!o->builtin_ref) {
        if (rlx_registry_create(o->plugin_dir, &r->registry) != RLX_OK) {
            snprintf(why, why_len, "cannot search for plugins: %s", rlx_last_error());
            goto fail;
        }
        if (rlx_registry_load(r->registry, RLX_PLUGIN_BACKEND, o->plugin, &r->plugin) != RLX_OK) {
            char first[1024];
            snprintf(first, sizeof first, "%s", rlx_last_error());
            /* A plugin built for another ABI is skipped by the name search; say so. */
            failed_files f = {.len = 0};
            if (!strchr(o->plugin, '/'))
                rlx_registry_each(r->registry, collect_failures, &f);
            snprintf(why, why_len, "cannot load backend plugin '%s': %s%s%s", o->plugin, first,
                     f.len ? "\n  plugin files that failed to load:" : "", f.text);
            goto fail;
        }
    }
    if (open_tested(r, &r->tested) != RLX_OK) {
        snprintf(why, why_len, "backend plugin '%s' (%s) failed to open: %s", o->plugin,
                 r->plugin ? rlx_plugin_path(r->plugin) : "built in", rlx_last_error());
        goto fail;
    }
    rlx_backend_options emulate = rlx_backend_options_default();
    emulate.extra = "act=bf16";
    if (rlx_backend_create_ref(&r->ref) != RLX_OK || rlx_backend_create_ref_opts(&emulate, &r->ref_bf16) != RLX_OK) {
        snprintf(why, why_len, "cannot open the reference kernels: %s", rlx_last_error());
        goto fail;
    }
    if (r->plugin) {
        const rlx_plugin *d = rlx_plugin_desc(r->plugin);
        snprintf(r->describe, sizeof r->describe, "backend '%s' %s (%s), built for ABI %u.%u; this rlx has ABI %d.%d",
                 d->name, d->version, rlx_plugin_path(r->plugin), d->abi_major, d->abi_minor, RLX_ABI_MAJOR,
                 RLX_ABI_MINOR);
    } else {
        snprintf(r->describe, sizeof r->describe, "the reference kernels built into librlx (ABI %d.%d)", RLX_ABI_MAJOR,
                 RLX_ABI_MINOR);
    }
    *out = r;
    return 0;
fail:
    kit_runner_close(r);
    return -1;
}

static void free_kept(kit_runner *r) {
    for (size_t i = 0; i < r->n_kept; i++)
        free(r->kept[i]);
    r->n_kept = 0;
    r->kept_bytes = 0;
}

void kit_runner_close(kit_runner *r) {
    if (!r)
        return;
    rlx_backend_destroy(r->tested);
    rlx_backend_destroy(r->ref);
    rlx_backend_destroy(r->ref_bf16);
    free_kept(r);
    free(r->kept);
    rlx_plugin_unload(r->plugin);
    rlx_registry_destroy(r->registry);
    free(r);
}

const char *kit_runner_describe(const kit_runner *r) { return r->describe; }

/* Takes the weights of node into the kept list; past the budget, reopens the tested backend
 * so they can be freed. */
static void keep_weights(kit_runner *r, kit_node *n) {
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        if (!n->is_weight[i] || !n->in[i].data)
            continue;
        if (r->n_kept == r->cap_kept) {
            size_t cap = r->cap_kept ? r->cap_kept * 2 : 64;
            void **k = realloc(r->kept, cap * sizeof *k);
            if (!k)
                continue; /* freed with the node: harmless unless the backend caches by pointer */
            r->kept = k;
            r->cap_kept = cap;
        }
        r->kept[r->n_kept++] = n->in[i].data;
        r->kept_bytes += rlx_iface_tensor_bytes(&n->in[i]);
        n->in[i].data = NULL;
    }
    if (r->kept_bytes > KEEP_BUDGET && !r->o->builtin_ref) {
        rlx_backend_destroy(r->tested);
        r->tested = NULL;
        free_kept(r);
        if (open_tested(r, &r->tested) != RLX_OK)
            r->tested = NULL; /* the next check reports it */
    }
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static size_t bytes_of(const rlx_tensor *t) { return rlx_iface_tensor_bytes(t); }

static int is_state(const kit_node *n, uint32_t i) { return kit_is_state(n->op, i); }

static void result(kit_result *res, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void result(kit_result *res, int status, const char *fmt, ...) {
    res->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->detail, sizeof res->detail, fmt, ap);
    va_end(ap);
}

static void where(const rlx_tensor *t, int64_t i, char *buf, size_t len) {
    int64_t cols = t->shape[t->n_dims - 1];
    snprintf(buf, len, "[%lld,%lld]", (long long)(i / cols), (long long)(i % cols));
}

/* The tolerance part of judge() for a MATMUL or MOE the backend computes with BF16-rounded
 * inputs (see KIT_BF16_UNIT): within the BF16 bound of the exact expectation `want`, and close
 * to the BF16-emulating reference kernels. tol is the op's F32 tolerance. */
/* A MATMUL of a backend that declares RLX_PRECISION_Q8_ACT against the exact result, within
 * KIT_Q8_STEP (kit.h) per element. */
static void judge_q8(kit_runner *r, const kit_check *c, const kit_node *n, const float *got, const float *want,
                     double scale, double tol, kit_result *res) {
    const int64_t M = n->in[0].shape[0], K = n->in[0].shape[1], N = n->in[1].shape[0];
    const int64_t block = rlx_iface_dtype_block(n->in[1].dtype);
    const size_t row_bytes = rlx_iface_row_bytes(n->in[1].dtype, K);
    float *w = kit_alloc((size_t)K * sizeof *w);
    if (!w) {
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    double ratio = 0, err_x = 0, bound_x = 0;
    int64_t at_x = 0;
    for (int64_t o = 0; o < N; o++) {
        rlx_iface_dequant_row(n->in[1].dtype, (const char *)n->in[1].data + (size_t)o * row_bytes, w, K);
        for (int64_t m = 0; m < M; m++) {
            const float *x = (const float *)n->in[0].data + m * K;
            double bound = tol * scale;
            const int has_min = n->in[1].dtype == RLX_DTYPE_Q4_1 || n->in[1].dtype == RLX_DTYPE_Q5_1;
            const uint8_t *wrow = (const uint8_t *)n->in[1].data + (size_t)o * row_bytes;
            for (int64_t b = 0; b < K; b += block) {
                double amax = 0, wsum = 0, xsum = 0;
                for (int64_t k = b; k < b + block; k++) {
                    amax = fmax(amax, fabs((double)x[k]));
                    wsum += fabs((double)w[k]);
                    xsum += fabs((double)x[k]);
                }
                bound += KIT_Q8_STEP * amax / 127.0 * wsum;
                if (has_min) { /* the block's minimum: its second F16 */
                    uint16_t wmin;
                    memcpy(&wmin, wrow + (size_t)(b / block) * rlx_iface_dtype_block_bytes(n->in[1].dtype) + 2, 2);
                    bound += KIT_Q8_MIN_UNIT * fabs((double)rlx_iface_f16_to_f32(wmin)) * xsum;
                }
            }
            const int64_t i = m * N + o;
            const double d = fabs((double)got[i] - want[i]);
            if (d / bound > ratio) {
                ratio = d / bound;
                err_x = d;
                bound_x = bound;
                at_x = i;
            }
        }
    }
    free(w);
    res->err = err_x;
    res->limit = bound_x;
    if (ratio <= 1) {
        result(res, KIT_PASS, "%s", "");
        return;
    }
    char pos[64];
    where(&n->out, at_x, pos, sizeof pos);
    result(res, KIT_FAIL,
           "backend '%s' (q8-act), node '%s': output%s = %.7g, exact %.7g: error %.3g beyond the bound %.3g of "
           "8-bit activations",
           rlx_backend_name(r->tested), c->name, pos, (double)got[at_x], (double)want[at_x], err_x, bound_x);
}

static void judge_bf16(kit_runner *r, const kit_check *c, const kit_node *n, const float *got, const float *want,
                       double scale, double tol, kit_result *res) {
    const int64_t numel = rlx_tensor_numel(&n->out);
    float *emu = kit_alloc((size_t)numel * 4);
    if (!emu) {
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    rlx_tensor o = n->out;
    o.data = emu;
    rlx_node_view v = {
        .op = n->op, .n_inputs = n->n_inputs, .inputs = n->in, .output = &o, .params = &n->p, .name = c->name};
    phase(r, "the BF16-emulating reference kernels");
    if (rlx_backend_compute(r->ref_bf16, &v) != RLX_OK) {
        result(res, KIT_FAIL, "the BF16-emulating reference kernels failed: %s", rlx_last_error());
        free(emu);
        return;
    }
    /* exact: the worst ratio of |got - want| to its bound */
    double ratio = 0, err_x = 0, bound_x = 0;
    int64_t at_x = 0;
    const int64_t N = n->out.shape[n->out.n_dims - 1], K = n->in[0].shape[n->in[0].n_dims - 1];
    float *w = kit_alloc((size_t)K * sizeof *w);
    if (!w) {
        free(emu);
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    for (int64_t i = 0; i < numel; i++) {
        double bound = KIT_BF16_MOE_EXACT * scale;
        if (n->op == RLX_OP_MATMUL) {
            const float *x = (const float *)n->in[0].data + (i / N) * K;
            rlx_iface_dequant_row(
                n->in[1].dtype, (const char *)n->in[1].data + (size_t)(i % N) * rlx_iface_row_bytes(n->in[1].dtype, K),
                w, K);
            double sum = 0;
            for (int64_t k = 0; k < K; k++)
                sum += fabs((double)x[k] * w[k]);
            bound = KIT_BF16_UNIT * sum + tol * scale;
        }
        const double d = fabs((double)got[i] - want[i]);
        if (d / bound > ratio) {
            ratio = d / bound;
            err_x = d;
            bound_x = bound;
            at_x = i;
        }
    }
    free(w);
    double scale_e = 1, err_e = 0;
    int64_t at_e = 0;
    for (int64_t i = 0; i < numel; i++)
        scale_e = fmax(scale_e, fabs(emu[i]));
    for (int64_t i = 0; i < numel; i++)
        if (fabs((double)got[i] - emu[i]) > err_e) {
            err_e = fabs((double)got[i] - emu[i]);
            at_e = i;
        }
    const char *bound_text = n->op == RLX_OP_MATMUL ? "2^-8 sum|x w| + F32" : "stated MOE";
    res->err = err_e;
    res->limit = (n->op == RLX_OP_MATMUL ? tol : KIT_BF16_MOE_EMULATED) * scale_e;
    char pos[64];
    if (ratio > 1) {
        where(&n->out, at_x, pos, sizeof pos);
        result(res, KIT_FAIL,
               "backend '%s' (bf16-act), node '%s': output%s = %.7g, exact %.7g: error %.3g beyond %s "
               "bound %.3g",
               rlx_backend_name(r->tested), c->name, pos, (double)got[at_x], (double)want[at_x], err_x, bound_text,
               bound_x);
    } else if (err_e > res->limit) {
        where(&n->out, at_e, pos, sizeof pos);
        result(res, KIT_FAIL, "backend '%s' (bf16-act), node '%s': output%s = %.7g, BF16 emulation %.7g",
               rlx_backend_name(r->tested), c->name, pos, (double)got[at_e], (double)emu[at_e]);
    } else {
        result(res, KIT_PASS, "bf16-act: vs BF16 emulation; vs exact %.3g of the %s bound", ratio, bound_text);
    }
    free(emu);
}

/* Runs node (inputs filled) on the tested backend, which computes it in precision prec, and
 * judges it. */
/* The view of node n over inputs in that a backend gets at planning time: shapes and params,
 * data pointers NULL. Returns the input array (freed by the caller; out and v point into it
 * and at out), or NULL when out of memory. */
static rlx_tensor *planning_view(const kit_node *n, const rlx_tensor *in, const char *name, rlx_tensor *out,
                                 rlx_node_view *v) {
    rlx_tensor *shapes = calloc(n->n_inputs + 1, sizeof *shapes);
    if (!shapes)
        return NULL;
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        shapes[i] = in[i];
        shapes[i].data = NULL;
    }
    *out = n->out;
    out->data = NULL;
    *v = (rlx_node_view){.op = n->op,
                         .n_inputs = n->n_inputs,
                         .inputs = shapes,
                         .output = out,
                         .params = &n->p,
                         .name = name,
                         .output_id = -1};
    return shapes;
}

/* After a claimed call: nothing written past the output (numel F32 values, then GUARD_BYTES
 * of 0xa5) nor into an input other than state (hashes taken before). Returns 0, or -1 with res
 * set. */
static int check_written(const char *bname, const char *name, const kit_node *n, const rlx_tensor *in,
                         const uint64_t *hashes, const uint8_t *out, int64_t numel, kit_result *res) {
    const size_t out_bytes = (size_t)numel * 4;
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (out[out_bytes + i] != 0xa5) {
            result(res, KIT_FAIL, "backend '%s' wrote past the end of the output of node '%s' (byte %zu after it)",
                   bname, name, i);
            return -1;
        }
    for (uint32_t i = 0; i < n->n_inputs; i++)
        if (!is_state(n, i) && !kit_is_state_rows(n, i) && hash_bytes(in[i].data, bytes_of(&in[i])) != hashes[i]) {
            result(res, KIT_FAIL, "backend '%s' modified input %u of node '%s' (inputs are read-only)", bname, i, name);
            return -1;
        }
    return 0;
}

/* Every value of got (shaped as shape) written and finite; the largest |got - want| into
 * *worst (at *at) and max(1, max|want|) into *scale. Returns 0, or -1 with res set. */
static int compare_out(const char *bname, const char *name, const rlx_tensor *shape, const float *got,
                       const float *want, int64_t numel, double *worst, int64_t *at, double *scale, kit_result *res) {
    *worst = 0;
    *scale = 1;
    *at = -1;
    for (int64_t i = 0; i < numel; i++)
        *scale = fmax(*scale, fabs(want[i]));
    for (int64_t i = 0; i < numel; i++) {
        char pos[64];
        uint32_t bits;
        memcpy(&bits, &got[i], 4);
        if (bits == MARKER_BITS) {
            where(shape, i, pos, sizeof pos);
            result(res, KIT_FAIL, "backend '%s' left output%s of node '%s' unwritten (it must write the whole output)",
                   bname, pos, name);
            res->err = INFINITY;
            return -1;
        }
        if (!isfinite(got[i])) {
            where(shape, i, pos, sizeof pos);
            result(res, KIT_FAIL, "backend '%s' returned %g at output%s of node '%s' (expected %.6g)", bname,
                   (double)got[i], pos, name, (double)want[i]);
            res->err = INFINITY;
            return -1;
        }
        const double d = fabs((double)got[i] - (double)want[i]);
        if (d > *worst) {
            *worst = d;
            *at = i;
        }
    }
    return 0;
}

static void judge(kit_runner *r, const kit_check *c, kit_node *n, uint32_t prec, kit_result *res) {
    const char *bname = rlx_backend_name(r->tested);
    int64_t numel = rlx_tensor_numel(&n->out);
    size_t out_bytes = (size_t)numel * 4;
    float *want = n->want, *ref_out = NULL;
    void *want_cache[2] = {n->want_cache[0], n->want_cache[1]}, *ref_cache[2] = {NULL, NULL}, *cache[2] = {NULL, NULL};
    void **prepared = NULL;
    rlx_tensor *shapes = NULL;
    uint64_t *hashes = calloc(n->n_inputs, sizeof *hashes);
    rlx_tensor *in = calloc(n->n_inputs, sizeof *in);
    uint8_t *out = kit_alloc(out_bytes + GUARD_BYTES);
    if (!hashes || !in || !out) {
        result(res, KIT_FAIL, "kit: out of memory");
        goto done;
    }
    /* the expectation: the reference kernels on private copies of the state */
    if (!want) {
        memcpy(in, n->in, n->n_inputs * sizeof *in);
        for (uint32_t s = 0; s < 2 && n->op == RLX_OP_ATTENTION; s++) {
            if (!(ref_cache[s] = kit_alloc(bytes_of(&n->in[4 + s])))) {
                result(res, KIT_FAIL, "kit: out of memory");
                goto done;
            }
            memcpy(ref_cache[s], n->in[4 + s].data, bytes_of(&n->in[4 + s]));
            in[4 + s].data = ref_cache[s];
        }
        rlx_tensor o = n->out;
        if (!(o.data = ref_out = kit_alloc(out_bytes))) {
            result(res, KIT_FAIL, "kit: out of memory");
            goto done;
        }
        rlx_node_view v = {
            .op = n->op, .n_inputs = n->n_inputs, .inputs = in, .output = &o, .params = &n->p, .name = c->name};
        phase(r, "the reference kernels");
        if (rlx_backend_compute(r->ref, &v) != RLX_OK) {
            result(res, KIT_FAIL, "the reference kernels failed (a bad case in the kit?): %s", rlx_last_error());
            goto done;
        }
        want = ref_out;
        want_cache[0] = ref_cache[0];
        want_cache[1] = ref_cache[1];
    }
    /* the tested backend: shared read-only inputs, its own copies of the state */
    memcpy(in, n->in, n->n_inputs * sizeof *in);
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        if (n->op == RLX_OP_ATTENTION && is_state(n, i)) { /* the only state judge() copies */
            if (!(cache[i - 4] = kit_alloc(bytes_of(&n->in[i])))) {
                result(res, KIT_FAIL, "kit: out of memory");
                goto done;
            }
            memcpy(cache[i - 4], n->in[i].data, bytes_of(&n->in[i]));
            in[i].data = cache[i - 4];
        } else {
            hashes[i] = hash_bytes(in[i].data, bytes_of(&in[i]));
        }
    }
    uint32_t marker = MARKER_BITS;
    for (int64_t i = 0; i < numel; i++)
        memcpy(out + 4 * i, &marker, 4);
    memset(out + out_bytes, 0xa5, GUARD_BYTES);
    rlx_tensor o = n->out;
    o.data = out;
    /* a backend that prepares weights gets its handles, as a plan would give them */
    if (!(prepared = calloc(n->n_inputs, sizeof *prepared))) {
        result(res, KIT_FAIL, "kit: out of memory");
        goto done;
    }
    /* what the backend saw at planning time, given with each weight */
    rlx_tensor planned_out;
    rlx_node_view planned;
    if (!(shapes = planning_view(n, in, c->name, &planned_out, &planned))) {
        result(res, KIT_FAIL, "kit: out of memory");
        goto done;
    }
    if (rlx_backend_features(r->tested) & RLX_BACKEND_PREPARES_WEIGHTS) {
        phase(r, "prepare_weight()");
        for (uint32_t i = 0; i < n->n_inputs; i++) {
            const rlx_weight_info w = {
                .size = sizeof w, .tensor = &in[i], .name = c->name, .op = n->op, .input = i, .node = &planned};
            if (n->is_weight[i] && rlx_backend_prepare_weight(r->tested, &w, &prepared[i]) != RLX_OK) {
                result(res, KIT_FAIL, "claimed the node, then failed to prepare its weight (input %u): %s", i,
                       rlx_last_error());
                goto done;
            }
        }
    }
    rlx_node_view v = {.op = n->op,
                       .n_inputs = n->n_inputs,
                       .inputs = in,
                       .output = &o,
                       .params = &n->p,
                       .name = c->name,
                       .prepared = prepared,
                       .output_id = -1};
    phase(r, "compute()");
    if (rlx_backend_compute(r->tested, &v) != RLX_OK) {
        result(res, KIT_FAIL, "claimed the node, then failed it: %s", rlx_last_error());
        goto done;
    }
    const float *got = (const float *)out;
    double worst = 0, scale = 1;
    int64_t at = -1;
    if (check_written(bname, c->name, n, in, hashes, out, numel, res) < 0 ||
        compare_out(bname, c->name, &n->out, got, want, numel, &worst, &at, &scale, res) < 0)
        goto done;
    for (uint32_t s = 0; s < 2 && n->op == RLX_OP_ATTENTION; s++) {
        /* caches compared bit for bit in their own dtype (F16 rows rounded to nearest even); a
         * row of a 3-D cache is named by slot and position */
        const rlx_tensor *t = &n->in[4 + s];
        const int64_t cap = t->shape[t->n_dims - 2];
        const size_t row_bytes = rlx_iface_row_bytes(t->dtype, rlx_iface_cols(t));
        for (int64_t row = 0; row < rlx_iface_rows(t); row++)
            if (memcmp((const char *)cache[s] + row * row_bytes, (const char *)want_cache[s] + row * row_bytes,
                       row_bytes) != 0) {
                char which[64];
                if (t->n_dims == 3)
                    snprintf(which, sizeof which, "slot %lld row %lld", (long long)(row / cap), (long long)(row % cap));
                else
                    snprintf(which, sizeof which, "row %lld", (long long)row);
                result(res, KIT_FAIL, "backend '%s': %s %s after node '%s' differs from the expected cache", bname,
                       s ? "v_cache" : "k_cache", which, c->name);
                goto done;
            }
    }
    double tol = kit_node_tol(r->o, n);
    if (prec == RLX_PRECISION_BF16_ACT && (n->op == RLX_OP_MATMUL || n->op == RLX_OP_MOE)) {
        judge_bf16(r, c, n, got, want, scale, tol, res);
        goto done;
    }
    if (prec == RLX_PRECISION_Q8_ACT && n->op == RLX_OP_MATMUL) {
        judge_q8(r, c, n, got, want, scale, tol, res);
        goto done;
    }
    res->err = worst;
    res->limit = tol * scale;
    if (worst <= res->limit) {
        result(res, KIT_PASS, "%s", "");
    } else {
        char pos[64];
        where(&n->out, at, pos, sizeof pos);
        result(res, KIT_FAIL, "backend '%s', node '%s': output%s = %.7g, expected %.7g", bname, c->name, pos,
               (double)got[at], (double)want[at]);
    }
done:
    for (uint32_t i = 0; prepared && i < n->n_inputs; i++)
        rlx_backend_release_weight(r->tested, prepared[i]);
    free(prepared);
    free(shapes);
    free(hashes);
    free(in);
    free(out);
    free(ref_out);
    free(ref_cache[0]);
    free(ref_cache[1]);
    free(cache[0]);
    free(cache[1]);
}

// ---------------------------------------------------------------------------------------------
// Recurrent ops (SSM_CONV, GATED_DELTA; ABI 1.6): calls over one state

/* Element i of tensor t as an index per dimension, "[1,0,5]". */
static void index_of(const rlx_tensor *t, int64_t i, char *buf, size_t len) {
    int64_t idx[RLX_MAX_DIMS];
    for (int d = (int)t->n_dims - 1; d >= 0; d--) {
        idx[d] = i % t->shape[d];
        i /= t->shape[d];
    }
    size_t at = (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < t->n_dims && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", d ? "," : "", (long long)idx[d]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* The calls of a recurrent node (kit_node's n_calls), in order: each on the reference kernels
 * over their state and on the tested backend over its own, so that each side carries what it
 * computed. A call that must succeed gets judge()'s checks on its output, then the state is
 * compared with the reference's within the op's tolerance (relative to max(1, max|state|)); a
 * call that must fail must return the contract's status and leave the state as it was, bit
 * for bit. A later call whose shapes the backend declines runs on the reference kernels, as a
 * plan for them would place it (run_op reports a case whose first call it declines NOT
 * CLAIMED). With state rows (ABI 1.7), every row's state is compared as the output is. */
static void judge_calls(kit_runner *r, const kit_check *c, kit_node *n, kit_result *res) {
    const char *bname = rlx_backend_name(r->tested);
    const uint32_t ni = n->n_inputs, ri = n->p.state_rows ? ni - 1 : UINT32_MAX;
    uint32_t si = 0, declined = 0, failing = 0;
    for (uint32_t i = 0; i < ni; i++)
        if (is_state(n, i))
            si = i;
    const size_t state_bytes = bytes_of(&n->in[si]);
    const int64_t cols = n->out.shape[1], state_numel = rlx_tensor_numel(&n->in[si]);
    int64_t max_rows = 1;
    for (uint32_t k = 0; k < n->n_calls; k++)
        max_rows = n->calls[(size_t)k * ni].shape[0] > max_rows ? n->calls[(size_t)k * ni].shape[0] : max_rows;
    const size_t out_cap = (size_t)(max_rows * cols) * 4;
    float *ref_state = kit_alloc(state_bytes), *state = kit_alloc(state_bytes), *before = kit_alloc(state_bytes);
    float *ref_out = kit_alloc(out_cap);
    /* the reference's state rows: as many rows as the longest call, each one sequence's state */
    const size_t rows_cap = ri != UINT32_MAX ? (size_t)max_rows * bytes_of(&n->in[ri]) / (size_t)n->in[ri].shape[0] : 0;
    float *ref_rows = rows_cap ? kit_alloc(rows_cap) : NULL;
    uint8_t *out = kit_alloc(out_cap + GUARD_BYTES);
    rlx_tensor *in = calloc(ni, sizeof *in), *ref_in = calloc(ni, sizeof *ref_in), *shapes = NULL;
    uint64_t *hashes = calloc(ni, sizeof *hashes);
    void **prepared = calloc(ni, sizeof *prepared);
    if (!ref_state || !state || !before || !ref_out || !out || !in || !ref_in || !hashes || !prepared ||
        (rows_cap && !ref_rows)) {
        result(res, KIT_FAIL, "kit: out of memory");
        goto done;
    }
    memcpy(ref_state, n->in[si].data, state_bytes);
    memcpy(state, n->in[si].data, state_bytes);
    const double tol = kit_node_tol(r->o, n);
    double ratio = -1, s_ratio = -1, state_err = 0, state_limit = 0;
    for (uint32_t k = 0; k < n->n_calls; k++) {
        const rlx_tensor *call = n->calls + (size_t)k * ni;
        const int64_t numel = call[0].shape[0] * cols;
        for (uint32_t i = 0; i < ni; i++)
            in[i] = n->is_weight[i] || i == si ? n->in[i] : call[i];
        memcpy(ref_in, in, ni * sizeof *in);
        in[si].data = state;
        ref_in[si].data = ref_state;
        if (ri != UINT32_MAX)
            ref_in[ri].data = ref_rows;
        rlx_tensor o = n->out;
        o.shape[0] = call[0].shape[0];
        o.data = ref_out;
        const rlx_node_view rv = {
            .op = n->op, .n_inputs = ni, .inputs = ref_in, .output = &o, .params = &n->p, .name = c->name};
        phase(r, "the reference kernels");
        int rc = rlx_backend_compute(r->ref, &rv);
        if (rc != n->call_status[k]) {
            result(res, KIT_FAIL,
                   "the reference kernels returned %d on call %u, the case wants %d (a bad case in the kit?): %s", rc,
                   k + 1, n->call_status[k], rc ? rlx_last_error() : "");
            goto done;
        }
        /* the tested backend, asked about this call's shapes as a plan for them would ask */
        rlx_tensor planned_out;
        rlx_node_view planned;
        free(shapes);
        if (!(shapes = planning_view(n, in, c->name, &planned_out, &planned))) {
            result(res, KIT_FAIL, "kit: out of memory");
            goto done;
        }
        planned.output->shape[0] = o.shape[0];
        phase(r, "supports()");
        const int claimed = rlx_backend_supports(r->tested, &planned);
        declined += !claimed;
        if (claimed && k == 0 && (rlx_backend_features(r->tested) & RLX_BACKEND_PREPARES_WEIGHTS)) {
            phase(r, "prepare_weight()");
            for (uint32_t i = 0; i < ni; i++) {
                const rlx_weight_info w = {
                    .size = sizeof w, .tensor = &in[i], .name = c->name, .op = n->op, .input = i, .node = &planned};
                if (n->is_weight[i] && rlx_backend_prepare_weight(r->tested, &w, &prepared[i]) != RLX_OK) {
                    result(res, KIT_FAIL, "claimed the node, then failed to prepare its weight (input %u): %s", i,
                           rlx_last_error());
                    goto done;
                }
            }
        }
        for (uint32_t i = 0; i < ni; i++)
            hashes[i] = i == si || i == ri ? 0 : hash_bytes(in[i].data, bytes_of(&in[i]));
        const uint32_t marker = MARKER_BITS;
        for (int64_t i = 0; i < numel; i++)
            memcpy(out + 4 * i, &marker, 4);
        const int64_t rows_numel = ri != UINT32_MAX ? rlx_tensor_numel(&in[ri]) : 0;
        for (int64_t i = 0; i < rows_numel; i++) /* a row the backend leaves unwritten shows */
            memcpy((float *)in[ri].data + i, &marker, 4);
        memset(out + (size_t)numel * 4, 0xa5, GUARD_BYTES);
        memcpy(before, state, state_bytes);
        o.data = out;
        const rlx_node_view v = {.op = n->op,
                                 .n_inputs = ni,
                                 .inputs = in,
                                 .output = &o,
                                 .params = &n->p,
                                 .name = c->name,
                                 .prepared = claimed ? prepared : NULL,
                                 .output_id = -1};
        phase(r, claimed ? "compute()" : "the reference kernels (a call the backend declined)");
        rc = rlx_backend_compute(claimed ? r->tested : r->ref, &v);
        if (n->call_status[k] != RLX_OK) {
            failing++;
            if (rc != n->call_status[k]) {
                result(res, KIT_FAIL,
                       "backend '%s', node '%s': call %u of %u returned %d (%s); the contract makes it fail with %d "
                       "(%s)",
                       bname, c->name, k + 1, n->n_calls, rc, rlx_status_str(rc), n->call_status[k],
                       rlx_status_str(n->call_status[k]));
                goto done;
            }
            if (memcmp(before, state, state_bytes) != 0) {
                result(res, KIT_FAIL,
                       "backend '%s', node '%s': call %u of %u failed as it must, but changed the state (a call that "
                       "fails must leave it as it was)",
                       bname, c->name, k + 1, n->n_calls);
                goto done;
            }
            continue;
        }
        if (rc != RLX_OK) {
            result(res, KIT_FAIL, "claimed the node, then failed call %u of %u: %s", k + 1, n->n_calls,
                   rlx_last_error());
            goto done;
        }
        double worst, scale;
        int64_t at;
        if (check_written(bname, c->name, n, in, hashes, out, numel, res) < 0 ||
            compare_out(bname, c->name, &o, (const float *)out, ref_out, numel, &worst, &at, &scale, res) < 0)
            goto done;
        const double r_call = tol > 0 ? worst / (tol * scale) : worst > 0 ? INFINITY : 0;
        if (r_call > ratio || !(worst <= tol * scale)) {
            ratio = r_call;
            res->err = worst;
            res->limit = tol * scale;
        }
        char pos[64];
        if (!(worst <= tol * scale)) {
            where(&o, at, pos, sizeof pos);
            result(res, KIT_FAIL, "backend '%s', node '%s': call %u of %u: output%s = %.7g, expected %.7g", bname,
                   c->name, k + 1, n->n_calls, pos, (double)((const float *)out)[at], (double)ref_out[at]);
            goto done;
        }
        if (rows_numel) {
            double rworst, rscale;
            if (compare_out(bname, c->name, &in[ri], in[ri].data, ref_rows, rows_numel, &rworst, &at, &rscale, res) <
                0) {
                strncat(res->detail, " (in its state rows)", sizeof res->detail - strlen(res->detail) - 1);
                goto done;
            }
            if (!(rworst <= tol * rscale)) {
                index_of(&in[ri], at, pos, sizeof pos);
                result(res, KIT_FAIL,
                       "backend '%s', node '%s': call %u of %u: state rows%s = %.7g, expected %.7g (error %.3g, "
                       "limit %.3g)",
                       bname, c->name, k + 1, n->n_calls, pos, (double)((const float *)in[ri].data)[at],
                       (double)ref_rows[at], rworst, tol * rscale);
                goto done;
            }
        }
        /* the state it carries to the next call */
        double sworst = 0, sscale = 1;
        int64_t sat = 0;
        for (int64_t i = 0; i < state_numel; i++)
            sscale = fmax(sscale, fabs(ref_state[i]));
        for (int64_t i = 0; i < state_numel; i++) {
            const double d = fabs((double)state[i] - ref_state[i]);
            if (!(d <= sworst)) {
                sworst = isnan(d) ? INFINITY : d;
                sat = i;
            }
        }
        const double s_call = tol > 0 ? sworst / (tol * sscale) : sworst > 0 ? INFINITY : 0;
        if (s_call > s_ratio) {
            s_ratio = s_call;
            state_err = sworst;
            state_limit = tol * sscale;
        }
        if (!(sworst <= tol * sscale)) {
            index_of(&n->in[si], sat, pos, sizeof pos);
            result(res, KIT_FAIL,
                   "backend '%s', node '%s': after call %u of %u the state%s = %.7g, expected %.7g (error %.3g, limit "
                   "%.3g)",
                   bname, c->name, k + 1, n->n_calls, pos, (double)state[sat], (double)ref_state[sat], sworst,
                   tol * sscale);
            goto done;
        }
    }
    char declined_text[96] = "";
    if (declined)
        snprintf(declined_text, sizeof declined_text, "; %u declined, run on the reference kernels", declined);
    char failing_text[64] = "";
    if (failing)
        snprintf(failing_text, sizeof failing_text, " (%u failing as they must, state kept)", failing);
    result(res, KIT_PASS, "%u calls%s, the state after each within %.3g (limit %.3g)%s", n->n_calls, failing_text,
           state_err, state_limit, declined_text);
done:
    for (uint32_t i = 0; prepared && i < ni; i++)
        rlx_backend_release_weight(r->tested, prepared[i]);
    free(prepared);
    free(shapes);
    free(hashes);
    free(in);
    free(ref_in);
    free(out);
    free(ref_out);
    free(ref_state);
    free(state);
    free(before);
    free(ref_rows);
}

// ---------------------------------------------------------------------------------------------
// Batch invariance (slot forms: ATTENTION, ABI 1.4; SSM_CONV and GATED_DELTA, ABI 1.6): a row's
// bits must not depend on the batch

/* Runs rows[0..m) of slot-form node n, gathered into a call of their own, on b: each input with
 * a row per row of the node (activations, positions, slots) gathered, weights as they are, and
 * state input i over states[i]. Output into out [m, cols]. */
static int run_rows(rlx_backend *b, const kit_node *n, const int64_t *rows, int64_t m, void *const *states, float *out,
                    const char *name) {
    const uint32_t ni = n->n_inputs;
    rlx_tensor *in = calloc(ni, sizeof *in);
    void **buf = calloc(ni, sizeof *buf);
    int rc = RLX_E_NOMEM;
    if (!in || !buf)
        goto done;
    memcpy(in, n->in, ni * sizeof *in);
    for (uint32_t i = 0; i < ni; i++) {
        if (is_state(n, i)) {
            in[i].data = states[i];
            continue;
        }
        if (n->is_weight[i])
            continue;
        const size_t row_bytes = bytes_of(&n->in[i]) / (size_t)n->in[i].shape[0];
        if (!(buf[i] = kit_alloc((size_t)m * row_bytes)))
            goto done;
        for (int64_t k = 0; k < m; k++)
            memcpy((char *)buf[i] + k * row_bytes, (const char *)n->in[i].data + rows[k] * row_bytes, row_bytes);
        in[i].shape[0] = m;
        in[i].data = buf[i];
    }
    rlx_tensor o = n->out;
    o.shape[0] = m;
    o.data = out;
    const rlx_node_view v = {
        .op = n->op, .n_inputs = ni, .inputs = in, .output = &o, .params = &n->p, .name = name, .output_id = -1};
    rc = rlx_backend_compute(b, &v);
done:
    for (uint32_t i = 0; buf && i < ni; i++)
        free(buf[i]);
    free(buf);
    free(in);
    return rc;
}

/* The recurrent state of slot 0 (pass 3 runs only its rows) or of every slot after a pass
 * matches the whole batch's, bit for bit. Returns 0, or -1 with res set. */
static int same_states(const kit_node *n, void *const *states, void *const *batch, int slot0_only, const char *bname,
                       const char *name, const char *what, kit_result *res) {
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        if (!is_state(n, i))
            continue;
        const size_t bytes = bytes_of(&n->in[i]) / (slot0_only ? (size_t)n->in[i].shape[0] : 1);
        if (memcmp(states[i], batch[i], bytes) != 0) {
            result(res, KIT_FAIL,
                   "backend '%s', node '%s': the state %s differs from the whole batch's (a slot's state must not "
                   "depend on the batch)",
                   bname, name, what);
            return -1;
        }
    }
    return 0;
}

/* Node n (slot form, inputs filled) as one batch on the tested backend, then on an instance
 * with another thread count, then each row in a call of its own (in order, so every row sees
 * the cache rows or state written before it), then slot 0's rows in calls of 5 without the
 * other slots' rows: every row's output must be the same bits every time, and so must a
 * recurrent op's state after each pass (slot 0's, after the last). */
static void judge_invariance(kit_runner *r, const kit_check *c, kit_node *n, kit_result *res) {
    const char *bname = rlx_backend_name(r->tested);
    const uint32_t ni = n->n_inputs;
    const int recurrent = n->op != RLX_OP_ATTENTION;
    const uint32_t pos_in = n->op == RLX_OP_ATTENTION ? 3 : n->op == RLX_OP_SSM_CONV ? 2 : 5, seq_in = ni - 1;
    const int64_t T = n->in[0].shape[0], cols = n->out.shape[1];
    const size_t row_bytes = (size_t)cols * sizeof(float);
    const int32_t *pos = n->in[pos_in].data, *seq = n->in[seq_in].data;
    float *batch = kit_alloc((size_t)T * row_bytes), *got = kit_alloc((size_t)T * row_bytes);
    void **states = calloc(ni, sizeof *states), **batch_states = calloc(ni, sizeof *batch_states);
    int64_t *rows = calloc((size_t)T, sizeof *rows);
    rlx_backend *other = NULL;
    int ok = batch && got && states && batch_states && rows;
    for (uint32_t i = 0; ok && i < ni; i++)
        if (is_state(n, i))
            ok = (states[i] = kit_alloc(bytes_of(&n->in[i]))) && (batch_states[i] = kit_alloc(bytes_of(&n->in[i])));
    if (!ok) {
        result(res, KIT_FAIL, "kit: out of memory");
        goto done;
    }
    for (int64_t t = 0; t < T; t++)
        rows[t] = t;
    const char *what[4] = {NULL, "on another thread count", "in a call of its own", "in calls of 5 rows of its slot"};
    const char *state_what[4] = {NULL, "on another thread count", "after each row in a call of its own",
                                 "of slot 0 after its rows in calls of 5"};
    for (int pass = 0; pass < 4; pass++) {
        for (uint32_t i = 0; i < ni; i++)
            if (is_state(n, i))
                memcpy(states[i], n->in[i].data, bytes_of(&n->in[i]));
        rlx_backend *b = r->tested;
        if (pass == 1) {
            rlx_backend_options bo = rlx_backend_options_default();
            bo.n_threads = r->o->threads == 1 ? 2 : 1;
            bo.extra = r->o->backend_opts;
            phase(r, "open() with another thread count");
            if ((r->o->builtin_ref ? rlx_backend_create_ref_opts(&bo, &other)
                                   : rlx_backend_create(r->plugin, &bo, &other)) != RLX_OK) {
                result(res, KIT_FAIL, "backend '%s' failed to open with %u threads: %s", bname, bo.n_threads,
                       rlx_last_error());
                goto done;
            }
            b = other;
        }
        phase(r, pass == 0 ? "compute()" : what[pass]);
        int rc = RLX_OK;
        int64_t done_rows = 0;
        if (pass < 2) {
            rc = run_rows(b, n, rows, T, states, pass ? got : batch, c->name);
            done_rows = T;
        } else {
            /* rows[0..m) of this pass, in the batch's order */
            int64_t m = 0;
            for (int64_t t = 0; t < T; t++)
                if (pass == 2 || seq[t] == 0)
                    rows[m++] = t;
            const int64_t step = pass == 2 ? 1 : 5;
            for (int64_t k = 0; k < m && rc == RLX_OK; k += step) {
                const int64_t cnt = m - k < step ? m - k : step;
                rc = run_rows(b, n, rows + k, cnt, states, got + k * cols, c->name);
            }
            done_rows = m;
        }
        if (rc != RLX_OK) {
            result(res, KIT_FAIL, "claimed the node, then failed it %s: %s", pass ? what[pass] : "", rlx_last_error());
            goto done;
        }
        for (int64_t k = 0; pass > 0 && k < done_rows; k++) {
            const int64_t t = pass < 2 ? k : rows[k];
            if (memcmp(got + k * cols, batch + t * cols, row_bytes) != 0) {
                result(res, KIT_FAIL,
                       "backend '%s', node '%s': row %lld (slot %d, position %d) %s differs from the same row in the "
                       "whole batch (a row's bits must not depend on the batch)",
                       bname, c->name, (long long)t, seq[t], pos[t], what[pass]);
                goto done;
            }
        }
        if (recurrent && pass == 0)
            for (uint32_t i = 0; i < ni; i++)
                if (is_state(n, i))
                    memcpy(batch_states[i], states[i], bytes_of(&n->in[i]));
        if (recurrent && pass > 0 &&
            same_states(n, states, batch_states, pass == 3, bname, c->name, state_what[pass], res) < 0)
            goto done;
        for (int64_t t = 0; t < T; t++)
            rows[t] = t;
    }
    res->err = 0;
    res->limit = 0;
    result(res, KIT_PASS, "%s",
           recurrent ? "bit for bit, outputs and states: alone, in slot chunks, and on another thread count"
                     : "bit for bit: alone, in slot chunks, and on another thread count");
done:
    rlx_backend_destroy(other);
    for (uint32_t i = 0; i < ni; i++) {
        free(states ? states[i] : NULL);
        free(batch_states ? batch_states[i] : NULL);
    }
    free(states);
    free(batch_states);
    free(batch);
    free(got);
    free(rows);
}

static void run_op(kit_runner *r, const kit_check *c, kit_result *res) {
    kit_node n;
    char why[512];
    int rc =
        c->source == KIT_SRC_REF ? kit_ref_node(c, &n, 0) : kit_fixture_read(c->path, &n, NULL, 0, 1, why, sizeof why);
    if (rc < 0) {
        result(res, KIT_FAIL, "kit: cannot build the case: %s", c->source == KIT_SRC_REF ? "out of memory" : why);
        return;
    }
    rlx_tensor *plan, plan_out;
    rlx_node_view v;
    if (!(plan = planning_view(&n, n.in, c->name, &plan_out, &v))) {
        kit_node_free(&n);
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    phase(r, "supports()");
    int claimed = rlx_backend_supports(r->tested, &v);
    const uint32_t prec = claimed ? rlx_backend_precision(r->tested, &v) : RLX_PRECISION_F32;
    free(plan);
    if (!claimed) {
        kit_node_free(&n);
        result(res, KIT_NOT_CLAIMED, "%s", "");
        return;
    }
    if (c->source == KIT_SRC_REF) {
        kit_node_free(&n);
        if (kit_ref_node(c, &n, 1) < 0) {
            kit_node_free(&n);
            result(res, KIT_FAIL, "kit: out of memory");
            return;
        }
    }
    if (kit_ref_invariance(c))
        judge_invariance(r, c, &n, res);
    else if (n.n_calls)
        judge_calls(r, c, &n, res);
    else
        judge(r, c, &n, prec, res);
    phase(r, "close() and open(), to release the weights it has seen");
    keep_weights(r, &n);
    kit_node_free(&n);
}

// ---------------------------------------------------------------------------------------------
// Whole-model checks

typedef struct golden {
    int32_t *tokens;
    uint32_t n_tokens, n_prompt;
    double tol;
    float *logits; /* [n_tokens, vocab] */
} golden;

static void golden_free(golden *g) {
    free(g->tokens);
    free(g->logits);
    memset(g, 0, sizeof *g);
}

/* <dir>/rlx-golden.txt ("tokens 1,2,3", "prompt N", "tol X" lines) and rlx-golden.f32. */
static int golden_read(const char *dir, int64_t vocab, golden *g, char *why, size_t why_len) {
    memset(g, 0, sizeof *g);
    char path[4200], line[65536];
    snprintf(path, sizeof path, "%s/rlx-golden.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, why_len, "no %.900s (tests/conformance/write_golden.py writes one)", path);
        return 1;
    }
    g->tol = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "tokens ", 7) == 0) {
            for (char *p = line + 7, *end; *p && *p != '\n'; p = *end == ',' ? end + 1 : end) {
                long v = strtol(p, &end, 10);
                if (end == p)
                    break;
                int32_t *grown = realloc(g->tokens, (g->n_tokens + 1) * sizeof *grown);
                if (!grown)
                    break;
                g->tokens = grown;
                g->tokens[g->n_tokens++] = (int32_t)v;
            }
        } else if (strncmp(line, "prompt ", 7) == 0) {
            g->n_prompt = (uint32_t)strtoul(line + 7, NULL, 10);
        } else if (strncmp(line, "tol ", 4) == 0) {
            g->tol = strtod(line + 4, NULL);
        }
    }
    fclose(f);
    if (!g->n_tokens || !g->n_prompt || g->n_prompt > g->n_tokens) {
        snprintf(why, why_len, "%.900s: needs 'tokens' and 'prompt' lines", path);
        golden_free(g);
        return -1;
    }
    snprintf(path, sizeof path, "%s/rlx-golden.f32", dir);
    size_t count = (size_t)g->n_tokens * (size_t)vocab;
    if (!(f = fopen(path, "rb")) || !(g->logits = malloc(count * 4)) || fread(g->logits, 4, count, f) != count ||
        fgetc(f) != EOF) {
        snprintf(why, why_len, "%.900s: missing or not %u x %lld float32 logits", path, g->n_tokens, (long long)vocab);
        if (f)
            fclose(f);
        golden_free(g);
        return -1;
    }
    fclose(f);
    return 0;
}

static int64_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Largest |got - want| over rows x vocab, NaN as infinity; scale collects max(1, |want|). */
static double compare_rows(const float *got, const float *want, size_t count, double *scale, size_t *bad) {
    double worst = 0;
    for (size_t i = 0; i < count; i++) {
        *scale = fmax(*scale, fabs(want[i]));
        double d = isfinite(got[i]) ? fabs((double)got[i] - want[i]) : INFINITY;
        if (d > worst) {
            worst = d;
            *bad = i;
        }
    }
    return worst;
}

static void run_model(kit_runner *r, const kit_check *c, kit_result *res) {
    rlx_runtime *rt = NULL;
    rlx_session *sr = NULL;
    golden g = {0};
    float *keep = NULL;
    char why[1024];
    phase(r, "a whole-model run");
    char config_path[4200];
    rlx_model_config cfg_file;
    snprintf(config_path, sizeof config_path, "%s/config.json", c->path);
    if (rlx_model_config_load(config_path, &cfg_file) != RLX_OK) {
        result(res, KIT_FAIL, "cannot open the model: %s", rlx_last_error());
        return;
    }
    const rlx_model_config *cfg = &cfg_file;
    int64_t vocab = cfg->vocab_size;
    int grc = golden_read(c->path, vocab, &g, why, sizeof why);
    if (grc != 0 && c->spec != KIT_MODEL_VS_REF) {
        if (grc > 0)
            result(res, KIT_SKIPPED, "%s", why);
        else
            result(res, KIT_FAIL, "%s", why);
        goto done;
    }
    /* default prompt: fixed ids below any special token */
    int32_t prompt_ids[12];
    uint32_t n_prompt = grc == 0 ? g.n_prompt : 12;
    const int32_t *prompt = grc == 0 ? g.tokens : prompt_ids;
    for (int i = 0; i < 12; i++)
        prompt_ids[i] = (int32_t)((i * 131 + 7) % (vocab > 8 ? vocab - 8 : vocab));
    const uint32_t decode_steps = 8;
    /* the model opened as an application opens it, on a fresh instance of the backend (its
     * weights are unmapped when the runtime closes, after that instance) */
    const rlx_runtime_backend tested = {
        .name = r->o->plugin, .n_threads = r->o->threads, .options = r->o->backend_opts};
    rlx_runtime_options ro = rlx_runtime_options_default();
    ro.model_dir = c->path;
    ro.plugin_dir = r->o->plugin_dir;
    ro.backends = &tested;
    ro.n_backends = 1;
    ro.kv_capacity = (grc == 0 ? g.n_tokens : n_prompt) + decode_steps + 8;
    if (rlx_runtime_open(&ro, &rt) != RLX_OK) {
        result(res, KIT_FAIL, "cannot open the model on the backend: %s", rlx_last_error());
        goto done;
    }
    rlx_session *st = rlx_runtime_session(rt);
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_start = 0,
                           .layer_end = (uint32_t)cfg->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1};
    /* a backend that rounds matmul inputs to BF16 is compared with the BF16-emulating
     * reference kernels and, loosely, with NumPy's exact logits (see KIT_BF16_UNIT). The
     * emulation rounds the inputs of every matmul, as a backend does on a model of one weight
     * dtype (the kit's models); tests/model/check_golden.py rounds exactly the declared nodes. */
    uint32_t prec = RLX_PRECISION_F32, prec_decode = RLX_PRECISION_F32;
    if (rlx_session_precision(st, n_prompt, &prec) != RLX_OK || rlx_session_precision(st, 1, &prec_decode) != RLX_OK) {
        result(res, KIT_FAIL, "cannot plan the model on the backend: %s", rlx_last_error());
        goto done;
    }
    const int bf16 = prec == RLX_PRECISION_BF16_ACT || prec_decode == RLX_PRECISION_BF16_ACT;
    const char *mode = bf16 ? "bf16-act: " : "";
    const float *got, *want;
    double worst = 0, scale = 1, tol = r->o->tol[KIT_TOL_MODEL];
    if (bf16 && !r->o->tol_set[KIT_TOL_MODEL])
        tol = c->spec == KIT_MODEL_VS_REF ? KIT_BF16_MODEL_EMULATED : KIT_BF16_MODEL_EXACT;
    size_t bad = 0;
    if (c->spec == KIT_MODEL_VS_REF) {
        const rlx_session_options so = {
            .size = sizeof so, .kv_capacity = ro.kv_capacity, .backends = &r->ref_bf16, .n_backends = bf16 ? 1 : 0};
        if (rlx_session_create(rlx_runtime_model(rt), &spec, &so, &sr) != RLX_OK) {
            result(res, KIT_FAIL, "cannot create a session on the reference kernels: %s", rlx_last_error());
            goto done;
        }
        size_t rows = n_prompt * (size_t)vocab;
        if (!(keep = malloc(rows * 4))) {
            result(res, KIT_FAIL, "kit: out of memory");
            goto done;
        }
        if (rlx_session_forward(sr, prompt, n_prompt, 1, &want) != RLX_OK) {
            result(res, KIT_FAIL, "reference kernels: %s", rlx_last_error());
            goto done;
        }
        memcpy(keep, want, rows * 4);
        if (rlx_session_forward(st, prompt, n_prompt, 1, &got) != RLX_OK) {
            result(res, KIT_FAIL, "prefill of %u tokens: %s", n_prompt, rlx_last_error());
            goto done;
        }
        worst = compare_rows(got, keep, rows, &scale, &bad);
        const char *phase = "prefill";
        size_t bad_row = bad / (size_t)vocab;
        int32_t next = (int32_t)argmax(keep + rows - vocab, vocab);
        for (uint32_t step = 0; step < decode_steps && isfinite(worst); step++) {
            if (rlx_session_forward(sr, &next, 1, 0, &want) != RLX_OK) {
                result(res, KIT_FAIL, "reference kernels: %s", rlx_last_error());
                goto done;
            }
            memcpy(keep, want, (size_t)vocab * 4);
            if (rlx_session_forward(st, &next, 1, 0, &got) != RLX_OK) {
                result(res, KIT_FAIL, "decode step %u: %s", step, rlx_last_error());
                goto done;
            }
            double w = compare_rows(got, keep, (size_t)vocab, &scale, &bad);
            if (w > worst) {
                worst = w;
                phase = "decode";
                bad_row = step;
            }
            next = (int32_t)argmax(keep, vocab);
        }
        res->err = worst;
        res->limit = tol * scale;
        if (worst <= res->limit)
            result(res, KIT_PASS, "%s%u prompt tokens, %u decode steps", bf16 ? "bf16-act: vs BF16 emulation, " : "",
                   n_prompt, decode_steps);
        else
            result(res, KIT_FAIL, "backend '%s': %s%s logits differ from the %sreference kernels (%s %zu, token %zu)%s",
                   rlx_backend_name(r->tested), mode, phase, bf16 ? "BF16-emulating " : "",
                   phase[0] == 'p' ? "position" : "step", bad_row, bad % (size_t)vocab,
                   isfinite(worst) ? "" : ": NaN or Inf");
    } else if (c->spec == KIT_MODEL_VS_GOLDEN) {
        if (!r->o->tol_set[KIT_TOL_MODEL] && g.tol > 0 && !bf16)
            tol = g.tol;
        if (rlx_session_forward(st, g.tokens, g.n_tokens, 1, &got) != RLX_OK) {
            result(res, KIT_FAIL, "forward of %u tokens: %s", g.n_tokens, rlx_last_error());
            goto done;
        }
        worst = compare_rows(got, g.logits, (size_t)g.n_tokens * (size_t)vocab, &scale, &bad);
        res->err = worst;
        res->limit = tol * scale;
        if (worst <= res->limit)
            result(res, KIT_PASS, "%s%u positions", mode, g.n_tokens);
        else
            result(res, KIT_FAIL, "%slogits differ from NumPy's at position %zu, token %zu: %.7g, expected %.7g", mode,
                   bad / (size_t)vocab, bad % (size_t)vocab, (double)got[bad], (double)g.logits[bad]);
    } else {
        if (rlx_session_forward(st, g.tokens, g.n_prompt, 0, &got) != RLX_OK) {
            result(res, KIT_FAIL, "prefill: %s", rlx_last_error());
            goto done;
        }
        /* A step whose NumPy top-1 margin is within twice the logits bound may flip in a correct
         * backend; from there on its ids are not comparable (bf16 mode only: the F32 bound
         * is far below the margins the golden prompts are chosen for). */
        const double bound = (bf16 ? (r->o->tol_set[KIT_TOL_MODEL] ? tol : KIT_BF16_MODEL_EXACT) : 0);
        for (uint32_t i = g.n_prompt; i < g.n_tokens; i++) {
            int32_t id = (int32_t)argmax(got, vocab);
            const float *row = g.logits + (size_t)(i - 1) * (size_t)vocab;
            double top = -INFINITY, second = -INFINITY, row_scale = 1;
            for (int64_t v = 0; v < vocab; v++) {
                row_scale = fmax(row_scale, fabs(row[v]));
                if (row[v] > top) {
                    second = top;
                    top = row[v];
                } else if (row[v] > second) {
                    second = row[v];
                }
            }
            if (bf16 && top - second <= 2 * bound * row_scale) {
                result(res, KIT_PASS,
                       "%s%u of %u greedy ids match; the %u after are not checked: NumPy's top-1 margin "
                       "%.3g at step %u is within twice the bf16 logits bound %.3g",
                       mode, i - g.n_prompt, g.n_tokens - g.n_prompt, g.n_tokens - i, top - second, i - g.n_prompt,
                       bound * row_scale);
                goto done;
            }
            if (id != g.tokens[i]) {
                result(res, KIT_FAIL, "%sgreedy step %u: id %d, NumPy's greedy path has %d", mode, i - g.n_prompt, id,
                       g.tokens[i]);
                goto done;
            }
            if (rlx_session_forward(st, &id, 1, 0, &got) != RLX_OK) {
                result(res, KIT_FAIL, "decode step %u: %s", i - g.n_prompt, rlx_last_error());
                goto done;
            }
        }
        result(res, KIT_PASS, "%s%u of %u ids match", mode, g.n_tokens - g.n_prompt, g.n_tokens - g.n_prompt);
    }
done:
    free(keep);
    golden_free(&g);
    rlx_session_destroy(sr);
    rlx_runtime_close(rt);
}

/* One model block planned twice on the tested backend, with its spans and node by node. */
typedef struct span_pair {
    rlx_graph *g;
    rlx_block_io io;
    rlx_plan *plan[2]; /* [0] spans, [1] RLX_PLAN_PER_NODE */
    float *cache[2];   /* each plan's K and V caches, all layers back to back */
} span_pair;

static void span_pair_free(span_pair *s) {
    for (int i = 0; i < 2; i++) {
        rlx_plan_destroy(s->plan[i]);
        free(s->cache[i]);
    }
    rlx_graph_destroy(s->g);
}

static int span_pair_open(rlx_model *m, rlx_backend *b, uint32_t n, uint32_t capacity, span_pair *s, char *why,
                          size_t why_len) {
    const rlx_model_config *cfg = rlx_model_config_of(m);
    const rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                                 .layer_end = (uint32_t)cfg->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1,
                                 .all_logits = 1};
    if (rlx_model_build_block(m, &spec, n, capacity, &s->g, &s->io) != RLX_OK) {
        snprintf(why, why_len, "cannot build the block: %s", rlx_last_error());
        return -1;
    }
    /* every cache or recurrent state gets room for the largest of them (F32: the block's default) */
    size_t per_cache = 0;
    for (uint32_t l = 0; l < s->io.n_layers; l++)
        for (int v = 0; v < 2; v++) {
            const size_t numel =
                (size_t)rlx_tensor_numel(rlx_graph_tensor(s->g, v ? s->io.v_cache[l] : s->io.k_cache[l]));
            per_cache = numel > per_cache ? numel : per_cache;
        }
    for (int i = 0; i < 2; i++) {
        const rlx_plan_options o = {
            .size = sizeof o, .flags = i ? RLX_PLAN_PER_NODE : 0, .backends = &b, .n_backends = 1};
        if (rlx_plan_create_opts(s->g, &o, &s->plan[i]) != RLX_OK) {
            snprintf(why, why_len, "cannot plan the model%s: %s", i ? " node by node" : "", rlx_last_error());
            return -1;
        }
        if (!(s->cache[i] = calloc(2 * s->io.n_layers * per_cache, sizeof(float)))) {
            snprintf(why, why_len, "kit: out of memory");
            return -1;
        }
        for (uint32_t l = 0; l < s->io.n_layers; l++)
            if (rlx_plan_bind(s->plan[i], s->io.k_cache[l], s->cache[i] + (2 * l) * per_cache) != RLX_OK ||
                rlx_plan_bind(s->plan[i], s->io.v_cache[l], s->cache[i] + (2 * l + 1) * per_cache) != RLX_OK) {
                snprintf(why, why_len, "kit: %s", rlx_last_error());
                return -1;
            }
    }
    return 0;
}

/* Runs both plans over ids at positions pos..pos+n-1; the largest difference of their logits
 * goes to *worst (relative to max(1, |per-node|) in *scale). */
static int span_pair_run(span_pair *s, int32_t *ids, int32_t *pos, uint32_t n, int64_t vocab, double *worst,
                         double *scale, char *why, size_t why_len) {
    const float *out[2];
    for (int i = 0; i < 2; i++) {
        if (rlx_plan_bind(s->plan[i], s->io.input, ids) != RLX_OK ||
            rlx_plan_bind(s->plan[i], s->io.positions, pos) != RLX_OK || rlx_plan_run(s->plan[i]) != RLX_OK) {
            snprintf(why, why_len, "%s: %s", i ? "node by node" : "with spans", rlx_last_error());
            return -1;
        }
        out[i] = rlx_plan_data(s->plan[i], s->io.output);
    }
    for (size_t k = 0; k < (size_t)n * (size_t)vocab; k++) {
        *scale = fmax(*scale, fabs(out[1][k]));
        const double d = fabs((double)out[0][k] - (double)out[1][k]);
        if (!(d <= *worst))
            *worst = isnan(d) ? INFINITY : d;
    }
    return 0;
}

/* A backend that runs spans must compute what its compute() gives node by node: a prefill
 * and a decode step of the model, each planned with spans and with RLX_PLAN_PER_NODE. */
static void run_model_spans(kit_runner *r, const kit_check *c, kit_result *res) {
    rlx_model *m = NULL;
    rlx_backend *b = NULL;
    span_pair prefill = {0}, decode = {0};
    char why[1024];
    phase(r, "a whole model with spans and node by node");
    if (rlx_model_open(c->path, &m) != RLX_OK) {
        result(res, KIT_FAIL, "cannot open the model: %s", rlx_last_error());
        return;
    }
    /* a fresh instance: what it prepares for this model is released when the model closes */
    if (open_tested(r, &b) != RLX_OK) {
        result(res, KIT_FAIL, "backend failed to open: %s", rlx_last_error());
        goto done;
    }
    if (!(rlx_backend_features(b) & RLX_BACKEND_RUNS_SPANS)) {
        result(res, KIT_SKIPPED, "the backend runs every node by itself (no compute_span)");
        goto done;
    }
    const int64_t vocab = rlx_model_config_of(m)->vocab_size;
    enum { N = 7, CAPACITY = 16 };
    int32_t ids[N + 1], pos[N + 1];
    for (int i = 0; i <= N; i++) {
        ids[i] = (int32_t)((i * 131 + 7) % (vocab > 8 ? vocab - 8 : vocab));
        pos[i] = i;
    }
    double worst = 0, scale = 1;
    if (span_pair_open(m, b, N, CAPACITY, &prefill, why, sizeof why) < 0 ||
        span_pair_open(m, b, 1, CAPACITY, &decode, why, sizeof why) < 0 ||
        span_pair_run(&prefill, ids, pos, N, vocab, &worst, &scale, why, sizeof why) < 0) {
        result(res, KIT_FAIL, "%s", why);
        goto done;
    }
    /* the decode plans continue from the caches their own prefill left */
    const rlx_model_config *cfg = rlx_model_config_of(m);
    const size_t cache_bytes =
        (size_t)2 * prefill.io.n_layers * CAPACITY * sizeof(float) * (size_t)(cfg->num_key_value_heads * cfg->head_dim);
    for (int i = 0; i < 2; i++)
        memcpy(decode.cache[i], prefill.cache[i], cache_bytes);
    if (span_pair_run(&decode, ids + N, pos + N, 1, vocab, &worst, &scale, why, sizeof why) < 0) {
        result(res, KIT_FAIL, "decode: %s", why);
        goto done;
    }
    uint32_t calls[2] = {rlx_plan_n_calls(prefill.plan[0]), rlx_plan_n_calls(decode.plan[0])};
    const uint32_t nodes = rlx_graph_n_nodes(prefill.g);
    const uint32_t prec = rlx_plan_node_precision(prefill.plan[0], 0);
    double tol = r->o->tol[KIT_TOL_MODEL];
    if (prec == RLX_PRECISION_BF16_ACT && !r->o->tol_set[KIT_TOL_MODEL])
        tol = KIT_BF16_MODEL_EMULATED;
    res->err = worst;
    res->limit = tol * scale;
    if (worst <= res->limit)
        result(res, KIT_PASS, "%u prompt tokens and a decode step; %u nodes in %u calls (prefill), %u (decode)", N,
               nodes, calls[0], calls[1]);
    else
        result(res, KIT_FAIL, "backend '%s': logits with spans differ from node-by-node ones by %.3g%s",
               rlx_backend_name(r->tested), worst, isfinite(worst) ? "" : " (NaN or Inf)");
done:
    span_pair_free(&prefill);
    span_pair_free(&decode);
    rlx_backend_destroy(b);
    rlx_model_close(m);
}

void kit_run_check(kit_runner *r, const kit_check *c, kit_result *res) {
    memset(res, 0, sizeof *res);
    res->err = -1;
    if (!r->tested) {
        result(res, KIT_FAIL, "backend failed to reopen: %s", rlx_last_error());
        return;
    }
    if (c->source == KIT_SRC_MODEL && c->spec == KIT_MODEL_SPANS) {
        run_model_spans(r, c, res);
    } else if (c->source == KIT_SRC_MODEL) {
        run_model(r, c, res);
    } else if (c->source == KIT_SRC_NUMPY && !c->path) {
        result(res, KIT_FAIL,
               "no NumPy expectation files (*.rlxcase) found; build rlx with python3-numpy installed, "
               "pass --data DIR, or skip this part with --no-numpy");
    } else {
        run_op(r, c, res);
    }
}
