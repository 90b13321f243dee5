/* Speculative decoding: a speculator proposes k tokens, the target verifies them in one forward
 * over k + 1 positions, and the standard rejection rule keeps the output distribution exactly
 * the target's (identical tokens under greedy).
 *
 * A speculator plugin returns an rlx_plugin descriptor of kind RLX_PLUGIN_SPECULATOR whose iface
 * is an rlx_speculator_iface. Unlike a backend, a speculator is a model-level component: it may
 * link librlx and use its public API (models, sessions, samplers) over the backends the target
 * runs on, which the host passes in rlx_spec_target.
 *
 * The protocol, per sequence: reset(), then propose() repeatedly. Each propose() first tells the
 * speculator what the accepted context gained since the previous call, then asks for up to k
 * tokens that follow it:
 *   - tokens: appended to the accepted context since the previous propose() (after reset: the
 *     whole prompt and the first generated token). Its first n_accepted entries are the first
 *     n_accepted tokens of the previous proposal, accepted as proposed, so the speculator can
 *     keep the state it built for them and drop the rest of its proposal instead of
 *     re-prefilling; the tokens after them are new (a correction, a bonus token, a prompt).
 *   - hidden: for speculators that set RLX_SPEC_NEEDS_HIDDEN, the target's final hidden states
 *     (after the final norm), n_hidden rows of hidden_size floats: row r is the state at the
 *     position just before tokens[n_tokens - n_hidden + r], i.e. the state whose logits
 *     predicted that token. n_hidden is n_tokens, or n_tokens - 1 at the start of a sequence
 *     (the first token has no state before it).
 * The speculator answers with n_proposed <= k tokens and, for each, the full probability row
 * (vocab floats) it drew the token from, under the sampling parameters it is given (temperature,
 * top-k, top-p, min-p; greedy, which temperature 0 arrives as, means a one-hot row on its
 * argmax). The penalties arrive too; a speculator that keeps no history of the context may
 * ignore them (a sampler it creates from the parameters starts with an empty history), since
 * any row keeps the output exact and only costs acceptance. Proposing 0 tokens is allowed: the
 * target then decodes one token normally. */
#ifndef RLX_SPECULATOR_H
#define RLX_SPECULATOR_H

#include "rlx/backend.h"
#include "rlx/gen.h"
#include "rlx/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the speculator drafts for; everything is borrowed for the speculator's lifetime. */
typedef struct rlx_spec_target {
    uint32_t size;                /* sizeof(rlx_spec_target) of the core */
    uint32_t kv_capacity;         /* positions the target holds; the speculator needs no more */
    const char *model_dir;        /* the target's model directory (config.json, safetensors) */
    int64_t vocab;                /* the target's vocabulary size: ids and probability rows use it */
    int64_t hidden_size;          /* width of the hidden rows given to propose() */
    rlx_backend *const *backends; /* preference order for the speculator's own graphs */
    size_t n_backends;
    const rlx_place_rule *rules; /* per-op placement of the target, may be NULL */
    size_t n_rules;
    const char *options; /* "key=value,key=value" from --spec-opts or the deployment file, may be NULL */
} rlx_spec_target;

typedef struct rlx_spec_update {
    const int32_t *tokens;
    uint32_t n_tokens;
    uint32_t n_accepted;
    const float *hidden; /* NULL unless the speculator sets RLX_SPEC_NEEDS_HIDDEN */
    uint32_t n_hidden;
} rlx_spec_update;

enum { RLX_SPEC_NEEDS_HIDDEN = 1u << 0 };

/* The most draft tokens rlx_spec_generate asks for per round. */
#define RLX_SPEC_MAX_DRAFT 64

typedef struct rlx_speculator_iface {
    uint32_t size;  /* sizeof(rlx_speculator_iface) the plugin was built with */
    uint32_t flags; /* RLX_SPEC_* */
    /* Version 1.0; all required. Errors: a negative status after host->error(). */
    int (*open)(const rlx_host *host, const rlx_spec_target *target, void **self);
    void (*close)(void *self);
    int (*reset)(void *self);
    /* tokens[k] and probs[k * vocab] are the caller's; *n_proposed <= k. */
    int (*propose)(void *self, const rlx_spec_update *update, uint32_t k, const rlx_sampler_params *sampling,
                   int32_t *tokens, float *probs, uint32_t *n_proposed);
} rlx_speculator_iface;

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
 * decoding's. */
RLX_API rlx_status rlx_spec_generate(const rlx_lm *lm, rlx_speculator *spec, uint32_t k, rlx_sampler *sampler,
                                     const int32_t *prompt, uint32_t n_prompt, uint32_t max_new, rlx_token_fn fn,
                                     void *ctx, rlx_spec_stats *stats);
/* rlx_spec_generate with the logits row each token was drawn from given to fn: the target's
 * verification row of the token's position (raw, before penalties and filters). */
RLX_API rlx_status rlx_spec_generate_ex(const rlx_lm *lm, rlx_speculator *spec, uint32_t k, rlx_sampler *sampler,
                                        const int32_t *prompt, uint32_t n_prompt, uint32_t max_new,
                                        rlx_token_logits_fn fn, void *ctx, rlx_spec_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
