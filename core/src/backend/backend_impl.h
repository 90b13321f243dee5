/* Private parts of the backend layer: the wrapper struct and dtype helpers shared with the
 * reference kernels. */
#ifndef RLX_BACKEND_IMPL_H
#define RLX_BACKEND_IMPL_H

#include "rlx/backend.h"

/* One prepared use of a weight: (owner, data, op, input) and the backend's answer. */
typedef struct rlx__prepared {
    uint64_t owner; /* 0: a free slot */
    const void *data;
    uint32_t op, input;
    void *handle; /* NULL when the backend declined */
} rlx__prepared;

struct rlx_backend {
    const rlx_backend_iface *iface;
    void *self;
    uint32_t abi_minor;
    /* the 1.2 members the plugin has, NULL otherwise */
    uint32_t (*precision)(void *self, const rlx_node_view *node); /* NULL: RLX_PRECISION_F32 */
    const char *(*describe)(void *self);                          /* NULL: "" */
    int (*prepare_weight)(void *self, const rlx_weight_info *weight, void **handle);
    void (*release_weight)(void *self, void *handle);
    int (*plan_span)(void *self, const rlx_span *run, uint32_t *n_taken, void **span);
    int (*compute_span)(void *self, void *span, const rlx_span *nodes);
    void (*release_span)(void *self, void *span);
    /* prepared weight uses, open addressing over a power-of-two table (under the live lock) */
    rlx__prepared *prepared;
    size_t n_prepared, cap_prepared;
    rlx_backend *prev_live, *next_live;
    char name[64];
};

/* Owners of prepared weights: a model, or a plan over a hand-built graph. An id is never
 * reused, so a handle can never be found again for data a later owner mapped at the same
 * address. */
uint64_t rlx__weight_owner_new(void);
/* Releases, on every live backend, the handles prepared for owner. */
void rlx__weight_owner_release(uint64_t owner);
/* The handle of one use of a weight of owner on b: prepared on first use, then remembered
 * until the owner or b goes. */
rlx_status rlx__backend_prepared(rlx_backend *b, uint64_t owner, const rlx_weight_info *weight, void **handle);
/* b's plan_span over run, with its answer checked (1 <= *n_taken <= run->n_nodes). */
rlx_status rlx__backend_plan_span(rlx_backend *b, const rlx_span *run, uint32_t *n_taken, void **span);
/* Runs a span b planned; on failure the message names b and the span's nodes. */
rlx_status rlx__backend_compute_span(rlx_backend *b, void *span, const rlx_span *nodes);
void rlx__backend_release_span(rlx_backend *b, void *span);

extern const rlx_backend_iface rlx__ref_backend_iface;

/* Element i of data stored as dtype (F32, BF16 or F16), as float. */
float rlx__load(const void *data, uint32_t dtype, size_t i);

/* The reference kernels of the recurrent ops (ABI 1.6, ref_recurrent.c), for nodes the graph
 * validated: they check positions and slots, and change no state when they reject a call. */
int rlx__ref_ssm_conv(const rlx_node_view *n);
int rlx__ref_gated_delta(const rlx_node_view *n);

#endif
