/* Backends execute graph nodes. A backend plugin returns an rlx_plugin descriptor of kind
 * RLX_PLUGIN_BACKEND whose iface is an rlx_backend_iface.
 *
 * Contracts for backend authors:
 * - open() creates one backend instance; everything it allocates is released by close().
 * - supports() is asked once per node at planning time (tensor data pointers are NULL); it must
 *   not fail, only answer. The scheduler gives a node to the first backend of the caller's list
 *   that supports it, and the core's reference kernels run what no backend claims.
 * - compute() runs one node whose inputs and output are bound to host memory: row-major,
 *   contiguous, aligned to 64 bytes for activations. The scheduler never lets a node's output
 *   share memory with its inputs. It must write the whole output and may not
 *   keep pointers to the tensors after it returns, except to WEIGHT data, which stays valid and
 *   unchanged until close() (so a backend may cache repacked weights keyed by pointer).
 * - Calls on one instance come from one thread at a time; a backend may use its own threads
 *   inside a call. Errors are reported by returning a negative status after host->error().
 * - Members marked "1.2" are optional: the core calls one only when the plugin's descriptor says
 *   abi_minor >= 2 and the table's size covers it, and otherwise uses the documented default. */
#ifndef RLX_BACKEND_H
#define RLX_BACKEND_H

#include "rlx/graph.h"
#include "rlx/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlx_backend_options {
    uint32_t size;      /* sizeof(rlx_backend_options) of the core */
    uint32_t n_threads; /* threads the backend may use; 0 = its own default */
    const char *extra;  /* free-form "key=value,key=value" backend options, may be NULL */
} rlx_backend_options;

/* How a backend computes a node: what its error against exact arithmetic is bounded by. Tests
 * (the conformance kit, the golden checks) take their tolerances from it. */
typedef enum rlx_precision {
    /* F32 arithmetic on weights widened exactly from their stored dtype: only the rounding of
     * F32 sums (about 1e-6 relative) separates the result from exact arithmetic. */
    RLX_PRECISION_F32 = 0,
    /* MATMUL inputs (the activations x) rounded to BF16, nearest even, then multiplied by the
     * (BF16) weights exactly and summed in F32: |y - exact| <= 2^-8 * sum_k |x_k w_k| plus the
     * F32 summation error. On MOE: the experts' matmul inputs likewise, the router exact. */
    RLX_PRECISION_BF16_ACT = 1,
    RLX_PRECISION_COUNT
} rlx_precision;

typedef struct rlx_backend_iface {
    uint32_t size; /* sizeof(rlx_backend_iface) the plugin was built with */
    uint32_t reserved;
    /* Version 1.0 */
    int (*open)(const rlx_host *host, const rlx_backend_options *opts, void **self); /* required */
    void (*close)(void *self);                                                       /* required */
    int (*supports)(void *self, const rlx_node_view *node); /* required: 1 yes, 0 no */
    int (*compute)(void *self, const rlx_node_view *node);  /* required */
    /* Version 1.2 */
    /* How the backend computes `node` (rlx_precision), asked at planning time after supports()
     * said yes (data pointers NULL). Optional; default RLX_PRECISION_F32. */
    uint32_t (*precision)(void *self, const rlx_node_view *node);
    /* One line saying what this instance runs on, for `rlx plugins -v` and benchmark records:
     * kernel ISA, library cores, threads ("avx2 kernels, OpenBLAS core Zen, 2 threads").
     * Borrowed until close(). Optional; default "". */
    const char *(*describe)(void *self);
} rlx_backend_iface;

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
