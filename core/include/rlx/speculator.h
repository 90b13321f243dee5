/* Speculative decoding, the core side: the loop (rlx_spec_generate) and the speculator handle.
 * What a speculator plugin implements (rlx_speculator_iface, the protocol) is in
 * rlx/speculator_iface.h, included here. */
#ifndef RLX_SPECULATOR_H
#define RLX_SPECULATOR_H

#include "rlx/backend.h"
#include "rlx/gen.h"
#include "rlx/plugin.h"
#include "rlx/speculator_iface.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- core side ----

typedef struct rlx_speculator rlx_speculator;

/* Opens a speculator from a loaded plugin of kind RLX_PLUGIN_SPECULATOR (the handle must
 * outlive it). */
RLX_API rlx_status rlx_speculator_create(const rlx_plugin_handle *plugin, const rlx_spec_target *target,
                                         rlx_speculator **out);
RLX_API void rlx_speculator_destroy(rlx_speculator *s); /* NULL is a no-op */
RLX_API const char *rlx_speculator_name(const rlx_speculator *s);
RLX_API uint32_t rlx_speculator_flags(const rlx_speculator *s);
RLX_API rlx_status rlx_speculator_reset(rlx_speculator *s);
/* Checks the answer (n_proposed <= k, ids inside the vocabulary, probability rows that are
 * finite, non-negative and give the proposed token a positive probability) and names the
 * speculator in errors. */
RLX_API rlx_status rlx_speculator_propose(rlx_speculator *s, const rlx_spec_update *update, uint32_t k,
                                          const rlx_sampler_params *sampling, int32_t *tokens, float *probs,
                                          uint32_t *n_proposed);

typedef struct rlx_spec_stats {
    rlx_gen_stats gen;
    uint64_t rounds;        /* propose + verify rounds */
    uint64_t proposed;      /* draft tokens proposed */
    uint64_t accepted;      /* draft tokens accepted */
    uint64_t target_passes; /* target forward calls after the prompt */
    double draft_seconds;   /* inside propose() */
    double verify_seconds;  /* inside the target's forward */
} rlx_spec_stats;

/* accepted / proposed (0 when nothing was proposed). */
RLX_API double rlx_spec_acceptance_rate(const rlx_spec_stats *st);
/* Accepted draft tokens per round. */
RLX_API double rlx_spec_mean_accepted(const rlx_spec_stats *st);
/* Generated tokens per target forward after the prompt. */
RLX_API double rlx_spec_tokens_per_pass(const rlx_spec_stats *st);

/* rlx_generate with speculation: prefills the prompt, then rounds of propose k, verify k + 1
 * positions in one lm->forward with all rows, accept by the rejection rule (greedy: exact
 * match), sample the correction or bonus token from the target, and truncate the lm past
 * rejected positions. The emitted tokens follow the target's distribution exactly; under greedy
 * they equal rlx_generate's. Stops as rlx_generate does. A speculator with
 * RLX_SPEC_NEEDS_HIDDEN needs an lm whose hidden() is not NULL. k is from 1 to
 * RLX_SPEC_MAX_DRAFT; a round drafts fewer when the context or max_new leaves less room. The
 * speculator is reset first and told the prompt as its context. Afterwards the lm holds what
 * rlx_generate would leave: the prompt and every generated token but the last. The prompt and
 * each emitted token enter the sampler's history in order, before the next verification row is
 * judged, so with penalties too the output is exactly (under greedy: identically) plain
 * decoding's. fn gets, with each token, the logits row it was drawn from: the target's
 * verification row of the token's position (raw, before penalties and filters). */
RLX_API rlx_status rlx_spec_generate(const rlx_lm *lm, rlx_speculator *spec, uint32_t k, rlx_sampler *sampler,
                                     const int32_t *prompt, uint32_t n_prompt, uint32_t max_new, rlx_token_fn fn,
                                     void *ctx, rlx_spec_stats *stats);

/* ---- deprecated, removed in rlx 0.3 ---- */

/* rlx_spec_generate. */
RLX_API rlx_status rlx_spec_generate_ex(const rlx_lm *lm, rlx_speculator *spec, uint32_t k, rlx_sampler *sampler,
                                        const int32_t *prompt, uint32_t n_prompt, uint32_t max_new, rlx_token_fn fn,
                                        void *ctx, rlx_spec_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
