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
 * target then decodes one token normally.
 *
 * A speculator plugin includes this header (its option string is read with the scanner of
 * rlx/plugin_iface.h) and, since it is a model-level component, the public API it drafts with
 * (rlx/rlx.h); the types it is handed (rlx_sampler_params, rlx_place_rule, rlx_backend) come
 * from there.
 *
 * The boundary is versioned like the backend one, although a speculator links librlx: every
 * struct that crosses it is sized or pinned (core/src/plugin/abi.c). The core's structs it is
 * handed (rlx_spec_target, rlx_spec_update, rlx_sampler_params) start with their size, and a
 * speculator reads past its own version's members only when that size covers them
 * (rlx_sampler_params_read does so for the sampling parameters). The structs it hands the core
 * (rlx_session_options, rlx_block_spec, rlx_sampler_params) carry the size it was built with,
 * and the core reads no further, taking the defaults for members appended since. The model's
 * rlx_model_config is read in place (members only appended) and rlx_place_rule is pinned. A
 * speculator must not call a function
 * that returns one of the sized structs by value (rlx_sampler_params_of): the caller's copy
 * could be shorter than the core's. */
#ifndef RLX_SPECULATOR_IFACE_H
#define RLX_SPECULATOR_IFACE_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/backend.h"
#include "rlx/gen.h"
#include "rlx/plugin_iface.h"
#include "rlx/sched.h"

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

/* Handed to propose() by the core; members are only appended, and a speculator built against a
 * newer header checks `size` (RLX_HAS) before it reads a member this version lacks. */
typedef struct rlx_spec_update {
    uint32_t size; /* sizeof(rlx_spec_update) of the core */
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

#ifdef __cplusplus
}
#endif
#endif
