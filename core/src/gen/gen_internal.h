/* Shared by the generation loops of gen/session.c and spec/speculator.c. */
#ifndef RLX_GEN_INTERNAL_H
#define RLX_GEN_INTERNAL_H

#include "rlx/gen.h"

/* Lets the rlx_token_fn of rlx_generate and rlx_spec_generate run the loops of their _ex forms. */
typedef struct rlx__token_fn_adapter {
    rlx_token_fn fn;
    void *ctx;
} rlx__token_fn_adapter;

/* An rlx_token_logits_fn whose ctx is an rlx__token_fn_adapter: calls its fn without the logits. */
int rlx__call_token_fn(void *adapter, int32_t token, const float *logits);

/* rlx_sampler_accept of ids[0..n) in order; stops at the first failure. */
rlx_status rlx__sampler_accept_all(rlx_sampler *s, const int32_t *ids, uint32_t n);

#endif
