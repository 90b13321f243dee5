/* Private parts of the backend layer: the wrapper struct and dtype helpers shared with the
 * reference kernels. */
#ifndef RLX_BACKEND_IMPL_H
#define RLX_BACKEND_IMPL_H

#include "rlx/backend.h"

struct rlx_backend {
    const rlx_backend_iface *iface;
    void *self;
    uint32_t (*precision)(void *self, const rlx_node_view *node); /* NULL: RLX_PRECISION_F32 */
    const char *(*describe)(void *self);                          /* NULL: "" */
    char name[64];
};

extern const rlx_backend_iface rlx__ref_backend_iface;

/* Element i of data stored as dtype (F32, BF16 or F16), as float. */
float rlx__load(const void *data, uint32_t dtype, size_t i);

#endif
