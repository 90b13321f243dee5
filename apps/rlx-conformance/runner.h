/* The runner's private header: the state a kit_runner holds and the steps its files share.
 * run.c opens the backends and runs one check; judge.c judges one node against its
 * expectation; judge_calls.c the recurrent ops' calls over one state; invariance.c a row's bits
 * against its batch; model.c the whole-model checks. */
#ifndef RLX_CONFORMANCE_RUNNER_H
#define RLX_CONFORMANCE_RUNNER_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "kit.h"

#define GUARD_BYTES 256
#define MARKER_BITS 0x7fc5a5a5u /* a quiet NaN no arithmetic produces: "never written" */

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

static inline void phase(kit_runner *r, const char *what) {
    if (r->phase)
        r->phase(r->phase_ctx, what);
}

static inline uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static inline size_t bytes_of(const rlx_tensor *t) { return rlx_iface_tensor_bytes(t); }

static inline int is_state(const kit_node *n, uint32_t i) { return kit_is_state(n->op, i); }

static inline void result(kit_result *res, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void result(kit_result *res, int status, const char *fmt, ...) {
    res->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->detail, sizeof res->detail, fmt, ap);
    va_end(ap);
}

static inline void where(const rlx_tensor *t, int64_t i, char *buf, size_t len) {
    int64_t cols = t->shape[t->n_dims - 1];
    snprintf(buf, len, "[%lld,%lld]", (long long)(i / cols), (long long)(i % cols));
}

/* The tested backend opened afresh with the kit's options (a new instance of the plugin). */
int kit_open_tested(kit_runner *r, rlx_backend **out);

/* judge.c */
rlx_tensor *kit_planning_view(const kit_node *n, const rlx_tensor *in, const char *name, rlx_tensor *out,
                              rlx_node_view *v);
int kit_check_written(const char *bname, const char *name, const kit_node *n, const rlx_tensor *in,
                      const uint64_t *hashes, const uint8_t *out, int64_t numel, kit_result *res);
int kit_compare_out(const char *bname, const char *name, const rlx_tensor *shape, const float *got, const float *want,
                    int64_t numel, double *worst, int64_t *at, double *scale, kit_result *res);
void kit_judge(kit_runner *r, const kit_check *c, kit_node *n, uint32_t prec, kit_result *res);

/* judge_calls.c, invariance.c */
void kit_judge_calls(kit_runner *r, const kit_check *c, kit_node *n, kit_result *res);
void kit_judge_invariance(kit_runner *r, const kit_check *c, kit_node *n, kit_result *res);

/* model.c */
void kit_run_model(kit_runner *r, const kit_check *c, kit_result *res);
void kit_run_model_spans(kit_runner *r, const kit_check *c, kit_result *res);

#endif
