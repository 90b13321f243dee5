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
 *   inside a call. Errors are reported by returning a negative status after host->error(). */
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

typedef struct rlx_backend_iface {
    uint32_t size; /* sizeof(rlx_backend_iface) the plugin was built with */
    uint32_t reserved;
    /* Version 1.0 */
    int (*open)(const rlx_host *host, const rlx_backend_options *opts, void **self); /* required */
    void (*close)(void *self);                                                       /* required */
    int (*supports)(void *self, const rlx_node_view *node); /* required: 1 yes, 0 no */
    int (*compute)(void *self, const rlx_node_view *node);  /* required */
} rlx_backend_iface;

/* ---- core side ---- */

typedef struct rlx_backend rlx_backend;

/* The reference backend built into librlx: portable C kernels for every op, slow but simple.
 * It is the fallback of the scheduler and the oracle backends are tested against. */
RLX_API rlx_status rlx_backend_create_ref(rlx_backend **out);

/* Opens a backend instance from a loaded backend plugin. The handle must outlive the backend. */
RLX_API rlx_status rlx_backend_create(const rlx_plugin_handle *plugin, const rlx_backend_options *opts,
                                      rlx_backend **out);
RLX_API void rlx_backend_destroy(rlx_backend *b);
RLX_API const char *rlx_backend_name(const rlx_backend *b);
RLX_API int rlx_backend_supports(rlx_backend *b, const rlx_node_view *node);
/* Runs one node; on failure the message names the backend and the node. */
RLX_API rlx_status rlx_backend_compute(rlx_backend *b, const rlx_node_view *node);
RLX_API rlx_backend_options rlx_backend_options_default(void);

#ifdef __cplusplus
}
#endif
#endif
