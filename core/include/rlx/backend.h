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
 * It is the fallback of the scheduler and the oracle backends are tested against. */
RLX_API rlx_status rlx_backend_create_ref(rlx_backend **out);
/* The reference backend with options (opts->extra may hold "act=bf16": MATMUL inputs and MOE
 * expert inputs are rounded to BF16 before the exact product, and the instance declares
 * RLX_PRECISION_BF16_ACT, so a backend's BF16 mode can be checked tightly on any CPU). The
 * scheduler's own fallback is always the plain reference backend. */
RLX_API rlx_status rlx_backend_create_ref_opts(const rlx_backend_options *opts, rlx_backend **out);

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

#ifdef __cplusplus
}
#endif
#endif
