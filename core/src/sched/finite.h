/* Finding NaN and infinity in float buffers: the scheduler's per-node check and the generation
 * code's check of the logits share it. */
#ifndef RLX_SCHED_FINITE_H
#define RLX_SCHED_FINITE_H

#include <stddef.h>
#include <stdint.h>

/* The index of the first NaN or infinity among the n values of dtype (RLX_DTYPE_F32, BF16 or
 * F16) at data, with its kind ("NaN", "+Inf" or "-Inf") in *kind; -1 when all are finite or
 * the dtype is not a float type. A pass that vectorizes: the scalar search runs only over a
 * block known to hold a bad value. */
int64_t rlx__first_nonfinite(uint32_t dtype, const void *data, size_t n, const char **kind);

#endif
