/* Generation: a session owns one sequence's KV cache for the layers of its block and runs the
 * block over new positions; a sampler turns logits into token ids; rlx_session_generate ties
 * them together with the stop rules.
 *
 * The cache holds `length` positions. A forward call over n new inputs writes positions
 * [length, length + n) in one graph execution (a whole prompt, one decode token, or k draft
 * tokens to verify) and advances length by n. rlx_session_truncate moves length back, after
 * which the discarded positions are recomputed as if never seen: attention only reads cache
 * rows at or before each query's position. */
#ifndef RLX_GEN_H
#define RLX_GEN_H

#include <stdint.h>
#include <string.h>

#include "rlx/backend.h"
#include "rlx/model.h"
#include "rlx/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Speculator plugins fill this in too, so it is sized: set size to sizeof(rlx_session_options).
 * Members are only appended; the core reads those the size covers and takes the defaults (0,
 * NULL) for the rest, so a struct built against an older header that ends before `rules` means
 * no placement. A size short of n_backends is RLX_E_INVALID. */
typedef struct rlx_session_options {
    uint32_t size;                /* sizeof(rlx_session_options) the caller was built with */
    uint32_t kv_capacity;         /* positions; 0 = min(max_position_embeddings, 4096) */
    rlx_backend *const *backends; /* preference order, borrowed; the reference kernels run the rest */
    size_t n_backends;
    const rlx_place_rule *rules; /* per-op placement overriding the order, borrowed; may be NULL */
    size_t n_rules;
    /* appended: the caches' rlx_dtype, RLX_DTYPE_F32 (0) or RLX_DTYPE_F16 (rows rounded to the
     * nearest F16 as they are written: half the memory, llama.cpp's default) */
    uint32_t kv_dtype;
    /* appended: non-zero plans with RLX_PLAN_CHECK_FINITE, so a forward stops at the first node
     * that writes a NaN or an infinity, naming it (a debugging mode: every node runs by itself
     * and its output is scanned). Without it only the logits are checked (rlx_session_forward). */
    uint32_t check_finite;
    /* appended: non-zero allows a kv_capacity past the model's max_position_embeddings, as
     * llama.cpp does with a warning: positions the model was not trained on, whose text may
     * degrade (the caller says so); without it such a capacity is RLX_E_RANGE */
    uint32_t beyond_trained;
} rlx_session_options;

typedef struct rlx_session rlx_session;

/* Creates a session running block `spec` of model m (borrowed, with the backends, for the
 * session's lifetime). The block is checked against the safetensors first. opts may be NULL
 * (all defaults). */
RLX_API rlx_status rlx_session_create(const rlx_model *m, const rlx_block_spec *spec, const rlx_session_options *opts,
                                      rlx_session **out);
RLX_API void rlx_session_destroy(rlx_session *s);

RLX_API uint32_t rlx_session_length(const rlx_session *s);
RLX_API uint32_t rlx_session_capacity(const rlx_session *s);

/* Runs n new positions. `input` is n token ids (int32) for a block that embeds, otherwise
 * n * hidden_size floats. With all_rows the output has a row per position, otherwise only the
 * last position's row (rows of vocab logits for a logits block, of hidden_size otherwise).
 * *out points into the session and stays valid until the next call on it. Token ids are
 * checked against the vocabulary and positions against the capacity before anything runs.
 * The logits rows a logits block returns are checked to be finite: a NaN or an infinity is
 * RLX_E_RANGE, "the logits of position P are not finite (NaN at vocabulary index I)", followed
 * by the first node that wrote a value that is not finite, found by running the same positions
 * again node by node (rlx_plan_run_checked) on this failure path only. The length is then
 * unchanged. */
RLX_API rlx_status rlx_session_forward(rlx_session *s, const void *input, uint32_t n, int all_rows, const float **out);

/* For a session whose block spec sets emit_hidden: the final hidden rows (after the final norm)
 * of every position of the last forward, valid until the next call; NULL otherwise. */
RLX_API const float *rlx_session_hidden(const rlx_session *s);

/* Forward of a session over an MTP block (spec.mtp): n pairs, ids[i] the token and hidden the
 * row of the target's final hidden state at the position before it (n * hidden_size floats);
 * *logits as rlx_session_forward. The pairs take the session's positions length, length + 1, ...
 * (the first pair of a sequence, whose hidden row is the target's position 0, at position 0):
 * RoPE attention sees only distances, so this offset from the target's positions is harmless.
 * rlx_session_forward refuses an MTP session. */
RLX_API rlx_status rlx_session_forward_mtp(rlx_session *s, const int32_t *ids, const float *hidden, uint32_t n,
                                           int all_rows, const float **logits);

/* Forgets every position from `length` on; length must not exceed the current length. */
RLX_API rlx_status rlx_session_truncate(rlx_session *s, uint32_t length);

/* Activation arena bytes of the most recent plan (after liveness reuse). */
RLX_API size_t rlx_session_peak_activation_bytes(const rlx_session *s);
/* The bytes of the session's per-sequence memory: the KV rows of its full-attention layers into
 * *kv_bytes, the recurrent state of its linear-attention layers (the convolution's last inputs
 * and the delta rule's state, docs/architectures.md) into *state_bytes; either may be NULL. */
RLX_API void rlx_session_memory(const rlx_session *s, uint64_t *kv_bytes, uint64_t *state_bytes);
/* Positions a session with linear-attention layers has run again, in all, to rebuild their
 * recurrent state after truncations (0 for other models). A truncation into a speculative
 * verification (a forward of 2 to 8 positions whose every logits row was read) runs none, nor
 * one into the last few one-position forwards of a session cut back every few such forwards (a
 * draft model's): the state of each of those positions was kept. */
RLX_API uint64_t rlx_session_replayed_positions(const rlx_session *s);
/* Writes the plan for n positions as text, each node with the backend that runs it (and its
 * precision, when not plain F32). */
RLX_API rlx_status rlx_session_dump_plan(rlx_session *s, uint32_t n, FILE *f);
/* The least exact rlx_precision any node of the plan for n positions is computed in (the
 * largest value), in *out. */
RLX_API rlx_status rlx_session_precision(rlx_session *s, uint32_t n, uint32_t *out);

// ---- language models ----

/* Whatever turns token ids into logits with a truncatable cache: a local session over a block
 * that embeds and produces logits, or a pipeline driver whose stages hold the cache. The
 * generation loop and speculative decoding run on this, so they work the same over both. */
typedef struct rlx_lm {
    void *self;
    /* As rlx_session_forward with token ids; the logits rows are vocab wide. */
    rlx_status (*forward)(void *self, const int32_t *ids, uint32_t n, int all_rows, const float **logits);
    rlx_status (*truncate)(void *self, uint32_t length);
    uint32_t (*length)(const void *self);
    uint32_t (*capacity)(const void *self);
    int64_t vocab;
    const int32_t *eos_ids; /* stop tokens */
    uint32_t n_eos;
    /* The target's final hidden states (after the final norm) of every position of the last
     * forward, n rows of hidden_size floats, valid until the next call; NULL as a member when
     * the lm does not provide them (an MTP speculator needs them). */
    const float *(*hidden)(void *self);
    int64_t hidden_size;
} rlx_lm;

/* True when token is one of lm's stop tokens. */
RLX_API int rlx_lm_is_eos(const rlx_lm *lm, int32_t token);

/* The rlx_lm view of a session (which must embed and produce logits); borrows s. */
RLX_API rlx_status rlx_session_lm(rlx_session *s, rlx_lm *out);

// ---- sampling ----

/* A sampler draws from the logits in Hugging Face's order: the penalties on the raw logits
 * (repetition, then presence and frequency), then temperature, top-k, top-p and min-p. The
 * penalties look at the sampler's history, the last repeat_last_n tokens the caller reported
 * with rlx_sampler_accept (rlx_generate and rlx_spec_generate report the prompt and every
 * generated token). Greedy, or temperature 0, takes the argmax of the penalised logits, as
 * Hugging Face does with do_sample=False and a repetition penalty; so does a temperature below
 * FLT_MIN, where the distribution would be the argmax's in double precision anyway. A window
 * (repeat_last_n) wider than the tokens accepted costs only what they take. Penalties that would
 * push a logit past the float range leave it at +-FLT_MAX.
 *
 * The struct crosses the speculator boundary both ways (propose() is handed the core's; a
 * speculator builds samplers from its own), so it is sized and members are only appended: the
 * side that reads one looks at `size`. rlx_sampler_create reads the members the size covers and
 * takes the defaults for the rest; a speculator reads what propose() hands it with
 * rlx_sampler_params_read. Both helpers are static inline, so each side gets the defaults of the
 * header it was built with. */
/* A bias added to one token's logit before the penalties and the filters (OpenAI's and
 * llama.cpp's logit_bias): -INFINITY bans the token. */
typedef struct rlx_logit_bias {
    int32_t token;
    float bias;
} rlx_logit_bias;

typedef struct rlx_sampler_params {
    uint32_t size;     /* sizeof(rlx_sampler_params) the writer was built with */
    int greedy;        /* 1: argmax of the penalised logits; temperature and the filters are ignored */
    float temperature; /* >= 0; 0, and anything below FLT_MIN (1.18e-38), is greedy */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* 1 = off; in (0, 1] */
    uint64_t seed;
    /* appended after the first version (RLX_SAMPLER_PARAMS_SIZE_1 bytes, which the core still
     * accepts): a writer built before them leaves them to the defaults */
    float min_p;             /* 0 = off; in [0, 1]: keeps tokens with at least min_p times the top probability */
    float repeat_penalty;    /* 1 = off; > 0: a seen token's logit l becomes l > 0 ? l / penalty : l * penalty */
    int32_t repeat_last_n;   /* the penalties' window: the last n tokens of the context; 0 = no penalties, -1 = all */
    float presence_penalty;  /* 0 = off: subtracted from the logit of every token in the window */
    float frequency_penalty; /* 0 = off: subtracted once per occurrence in the window */
    /* appended with logit biases: n_logit_bias entries, read (copied) by rlx_sampler_create; a
     * token listed twice gets the sum */
    const rlx_logit_bias *logit_bias;
    uint32_t n_logit_bias;
} rlx_sampler_params;

/* The size of the first version: the members up to seed. */
#define RLX_SAMPLER_PARAMS_SIZE_1 32u

typedef struct rlx_sampler rlx_sampler;

/* Greedy off, temperature 1, top_k 0, top_p 1, seed 0, min_p 0, repeat_penalty 1,
 * repeat_last_n 64, presence and frequency penalties 0: plain sampling at temperature 1. */
static inline rlx_sampler_params rlx_sampler_params_default(void) {
    return (rlx_sampler_params){.size = sizeof(rlx_sampler_params),
                                .greedy = 0,
                                .temperature = 1.0f,
                                .top_k = 0,
                                .top_p = 1.0f,
                                .seed = 0,
                                .min_p = 0.0f,
                                .repeat_penalty = 1.0f,
                                .repeat_last_n = 64,
                                .presence_penalty = 0.0f,
                                .frequency_penalty = 0.0f,
                                .logit_bias = NULL,
                                .n_logit_bias = 0};
}

/* The parameters at src as this header lays them out: the members src's size covers (it may
 * come from another version) over the defaults, with size set to this version's. */
static inline rlx_sampler_params rlx_sampler_params_read(const rlx_sampler_params *src) {
    rlx_sampler_params p = rlx_sampler_params_default();
    memcpy(&p, src, src->size < sizeof p ? src->size : sizeof p);
    p.size = sizeof p;
    return p;
}

/* Reads p as rlx_sampler_params_read does (a size below RLX_SAMPLER_PARAMS_SIZE_1 is
 * RLX_E_INVALID), checks every parameter (RLX_E_INVALID naming it: a negative or non-finite
 * temperature, top_k < 0, top_p outside (0, 1], min_p outside [0, 1], repeat_penalty <= 0, repeat_last_n < -1, a
 * non-finite penalty, a logit bias on a token outside the vocabulary, NaN or +infinity, or one
 * that bans every token) and creates a sampler with an empty history that the caller destroys.
 * The logit biases are copied: p->logit_bias may be freed once this returns. */
RLX_API rlx_status rlx_sampler_create(const rlx_sampler_params *p, int64_t vocab, rlx_sampler **out);
RLX_API void rlx_sampler_destroy(rlx_sampler *s);
/* Draws one token from logits[vocab]. The same seed, history and logits give the same tokens.
 * Does not add the token to the history (rlx_sampler_accept does). With a grammar, -1 (and
 * RLX_E_INVALID in rlx_last_error) when the grammar allows no token here. */
RLX_API int32_t rlx_sampler_sample(rlx_sampler *s, const float *logits);
/* The distribution the sampler draws from (after the grammar, the logit biases, the penalties, temperature,
 * top-k, top-p and min-p), written to probs[vocab]; greedy puts 1 on the argmax. Speculative
 * decoding needs it. */
RLX_API void rlx_sampler_probs(rlx_sampler *s, const float *logits, float *probs);
RLX_API rlx_sampler_params rlx_sampler_params_of(const rlx_sampler *s);
/* True when the sampler takes the argmax: greedy, or temperature 0. */
RLX_API int rlx_sampler_is_greedy(const rlx_sampler *s);
/* A uniform draw in [0, 1) from the sampler's generator. */
RLX_API double rlx_sampler_uniform(rlx_sampler *s);
/* Draws an id from probs[vocab] (non-negative, not necessarily normalised; a zero row is an
 * RLX_E_INVALID error reported as -1). */
RLX_API int32_t rlx_sampler_draw(rlx_sampler *s, const float *probs);
/* Records that token entered the context (prompt or generated), for the penalties: the window
 * keeps the last repeat_last_n tokens. Costs nothing beyond the range check when every penalty
 * is off. A token outside [0, vocab) is RLX_E_INVALID and leaves the history unchanged. With a
 * grammar, a generated token (not an end id) also moves the grammar past it: one the grammar
 * refuses is RLX_E_INVALID, history and grammar unchanged; so a prompt is reported with
 * rlx_generate's own calls, never through here, once a grammar is set. */
RLX_API rlx_status rlx_sampler_accept(rlx_sampler *s, int32_t token);
/* Constrained decoding (rlx/grammar.h): from here on the sampler draws only tokens matcher m
 * allows (its mask applies before the biases, the penalties and the filters; a greedy sampler
 * masks the whole vocabulary only when the grammar refuses the argmax), and one of the n_end
 * end_ids (copied) only where the grammar's text is complete. m is borrowed until it is
 * replaced or the sampler destroyed; NULL removes the grammar. rlx_generate, rlx_spec_generate
 * and the engine move m on with every token they accept, so a speculative draft the target
 * rejects never reaches it. */
typedef struct rlx_grammar_matcher rlx_grammar_matcher;
RLX_API rlx_status rlx_sampler_set_grammar(rlx_sampler *s, rlx_grammar_matcher *m, const int32_t *end_ids,
                                           size_t n_end);
/* Forgets the history (for a context rebuilt from scratch); the generator is untouched. */
RLX_API void rlx_sampler_reset_history(rlx_sampler *s);

// ---- generation loop ----

/* Why a generation loop ended. */
typedef enum rlx_gen_stop {
    RLX_GEN_STOP_NONE = 0,     /* it failed */
    RLX_GEN_STOP_EOS = 1,      /* an EOS id was generated (and reported) */
    RLX_GEN_STOP_MAX_NEW = 2,  /* max_new tokens were generated */
    RLX_GEN_STOP_CALLBACK = 3, /* the callback returned non-zero (on a token that is not an EOS id) */
    RLX_GEN_STOP_CONTEXT = 4,  /* the lm's context is full: the last token was reported, not fed */
} rlx_gen_stop;

typedef struct rlx_gen_stats {
    uint32_t n_prompt;
    uint32_t n_generated;
    double prompt_seconds;
    double generate_seconds; /* from the first to the last generated token's forward */
    int stopped_on_eos;
    uint32_t stop; /* rlx_gen_stop */
} rlx_gen_stats;

/* Called with every generated token and the raw logits row (vocab floats, before any penalty
 * or filter) it was drawn from, borrowed for the call; return non-zero to stop early. */
typedef int (*rlx_token_fn)(void *ctx, int32_t token, const float *logits);

/* Prefills prompt (n_prompt >= 1 ids, appended to what the model holds) in one forward, then
 * samples up to max_new tokens, stopping after an EOS id (which is reported to fn), when fn
 * returns non-zero, or when the context is full: a token sampled from the last position's
 * logits is reported but has no position to be fed at (RLX_GEN_STOP_CONTEXT, not an error; a
 * prompt longer than the room is one). Every prompt token and every generated token is accepted into the
 * sampler's history (rlx_sampler_accept), so the penalties see the prompt. fn may be NULL. On a
 * session, lm is rlx_session_lm's view of it. */
RLX_API rlx_status rlx_generate(const rlx_lm *lm, rlx_sampler *sampler, const int32_t *prompt, uint32_t n_prompt,
                                uint32_t max_new, rlx_token_fn fn, void *ctx, rlx_gen_stats *stats);

/* ---- deprecated, removed in rlx 0.3 ---- */

/* rlx_token_fn. */
typedef rlx_token_fn rlx_token_logits_fn;
/* rlx_generate. */
RLX_API rlx_status rlx_generate_ex(const rlx_lm *lm, rlx_sampler *sampler, const int32_t *prompt, uint32_t n_prompt,
                                   uint32_t max_new, rlx_token_fn fn, void *ctx, rlx_gen_stats *stats);
/* rlx_generate on rlx_session_lm(s). */
RLX_API rlx_status rlx_session_generate(rlx_session *s, rlx_sampler *sampler, const int32_t *prompt, uint32_t n_prompt,
                                        uint32_t max_new, rlx_token_fn fn, void *ctx, rlx_gen_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
