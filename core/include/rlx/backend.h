/* Backends execute graph nodes: the core side. What a backend plugin implements (rlx_backend_iface
 * and its contracts) is in rlx/backend_iface.h, included here. */
#ifndef RLX_BACKEND_H
#define RLX_BACKEND_H

#include "rlx/graph.h"
#include "rlx/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- core side ---- */

typedef struct rlx_backend rlx_backend;

/* The reference backend built into librlx: portable C kernels for every op, slow but simple.
 * It is the fallback of the scheduler and the oracle backends are tested against. opts may be
 * NULL; opts->extra may hold "act=bf16": MATMUL inputs and MOE expert inputs are rounded to
 * BF16 before the exact product, and the instance declares RLX_PRECISION_BF16_ACT, so a
 * backend's BF16 mode can be checked tightly on any CPU. The scheduler's own fallback is always
 * the plain reference backend. */
RLX_API rlx_status rlx_backend_create_ref(const rlx_backend_options *opts, rlx_backend **out);

/* Opens a backend instance from a loaded backend plugin. The handle must outlive the backend. */
RLX_API rlx_status rlx_backend_create(const rlx_plugin_handle *plugin, const rlx_backend_options *opts,
                                      rlx_backend **out);
RLX_API void rlx_backend_destroy(rlx_backend *b);
RLX_API const char *rlx_backend_name(const rlx_backend *b);
RLX_API int rlx_backend_supports(rlx_backend *b, const rlx_node_view *node);
/* How b computes node (rlx_precision); RLX_PRECISION_F32 for backends that do not say. */
RLX_API uint32_t rlx_backend_precision(rlx_backend *b, const rlx_node_view *node);
/* What the instance runs on (see rlx_backend_iface.describe); "" when it does not say. Borrowed
 * until rlx_backend_destroy. */
RLX_API const char *rlx_backend_describe(rlx_backend *b);
/* Static name of a precision: "f32", "bf16-act"; "?" if unknown. */
RLX_API const char *rlx_precision_name(uint32_t precision);
/* Runs one node; on failure the message names the backend and the node. */
RLX_API rlx_status rlx_backend_compute(rlx_backend *b, const rlx_node_view *node);
RLX_API rlx_backend_options rlx_backend_options_default(void);

/* What b implements of ABI 1.2's optional members. */
enum {
    RLX_BACKEND_PREPARES_WEIGHTS = 1u << 0, /* prepare_weight / release_weight */
    RLX_BACKEND_RUNS_SPANS = 1u << 1,       /* plan_span / compute_span / release_span */
};
RLX_API uint32_t rlx_backend_features(const rlx_backend *b);
/* The ABI minor b's plugin was built for (RLX_ABI_MINOR for the reference backend). */
RLX_API uint32_t rlx_backend_abi_minor(const rlx_backend *b);

/* Asks b to prepare one use of a weight outside a plan (plans prepare their weights
 * themselves): *handle is b's handle, or NULL when b does not prepare weights or declines this
 * one. A non-NULL handle is the caller's, released with rlx_backend_release_weight before
 * rlx_backend_destroy; the weight's data must stay valid and unchanged until then. */
RLX_API rlx_status rlx_backend_prepare_weight(rlx_backend *b, const rlx_weight_info *weight, void **handle);
RLX_API void rlx_backend_release_weight(rlx_backend *b, void *handle);

/* ---- deprecated, removed in rlx 0.3 ---- */

/* rlx_backend_create_ref. */
RLX_API rlx_status rlx_backend_create_ref_opts(const rlx_backend_options *opts, rlx_backend **out);

#ifdef __cplusplus
}
#endif
#endif
