/* The runtime: one call that opens everything a program needs to run a language model, so that
 * the rlx commands, `rlx stage`, an HTTP server and any program linking librlx assemble plugins
 * the same way.
 *
 * rlx_runtime_open takes either a model directory (the model runs in this process) or a
 * deployment (its stages run the model; this process drives them), plus:
 *   - backends: plugin names in preference order, each with its own threads and "key=value"
 *     options ("ref" is the reference kernels, which run whatever no backend claims anyway);
 *   - placement: "op=NAME,..." pins every node of an op to backend NAME (one of the list, or
 *     another plugin opened with the default options);
 *   - a speculator plugin, its draft tokens and options (or the deployment file's).
 * It returns a runtime that owns the plugins, backends, model, session or pipeline driver and
 * speculator, and hands out borrowed views: the rlx_lm to generate with, the backends, the
 * speculator. Nothing is printed: failures are a status with a message (rlx_last_error) that
 * says what could not be opened and why; informational lines go to the rlx_log handler at
 * RLX_LOG_DEBUG (one per opened backend: "backend NAME: what it runs on").
 *
 * Launching stage processes is not the runtime's business (the rlx CLI's --launch and --stages
 * fork them): a runtime connects to stages that listen already. */
#ifndef RLX_RUNTIME_H
#define RLX_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/deploy.h"
#include "rlx/dist.h"
#include "rlx/gen.h"
#include "rlx/speculator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most backend instances one runtime opens (the list and the placement's together). */
#define RLX_RUNTIME_MAX_BACKENDS 8
/* Draft tokens per round when neither the options nor the deployment file say. */
#define RLX_RUNTIME_DEFAULT_DRAFT_TOKENS 4

typedef struct rlx_runtime rlx_runtime;

/* One backend of the preference list. */
typedef struct rlx_runtime_backend {
    const char *name;    /* plugin name (matched ignoring case) or a path with '/'; "ref": reference kernels */
    uint32_t n_threads;  /* 0: rlx_runtime_options.n_threads */
    const char *options; /* the backend's "key=value,..." options (rlx_backend_options.extra); may be NULL */
} rlx_runtime_backend;

/* Flags of rlx_runtime_options. */
enum {
    /* Opens the model and the backends but no session: for rlx_runtime_serve_stage, which runs
     * a block of the model rather than all of it. Needs model_dir, refuses a deployment. */
    RLX_RUNTIME_STAGE = 1u << 0,
    /* Local runs: a kv_capacity past the model's max_position_embeddings is allowed
     * (rlx_session_options.beyond_trained); stages still refuse one. */
    RLX_RUNTIME_BEYOND_TRAINED = 1u << 1,
};

/* Start from rlx_runtime_options_default(). Members are only appended; the core reads those
 * that `size` covers and takes the defaults for the rest. Every pointer is borrowed for the
 * call only, except deploy (borrowed for the runtime's lifetime). */
typedef struct rlx_runtime_options {
    uint32_t size;         /* sizeof(rlx_runtime_options) the caller was built with */
    uint32_t flags;        /* RLX_RUNTIME_* */
    const char *model_dir; /* the model; overrides the deployment's; required without one */
    /* A deployment: its stages run the model and this process drives them over its transport,
     * with its speculator and timeouts unless the members below say otherwise. */
    const rlx_deploy *deploy;
    const char *plugin_dir; /* searched first for plugins (rlx_registry_create); may be NULL */
    /* Local runs (and a pipeline's drafting): backends in preference order; none = cpu-blas. */
    const rlx_runtime_backend *backends;
    size_t n_backends;
    const char *place;    /* "op=NAME,op=NAME": per-op placement; NULL or "" for none */
    uint32_t n_threads;   /* threads of backends that give none; 0 = each backend's default */
    uint32_t kv_capacity; /* positions; 0 = min(max_position_embeddings, 4096) or the stages' */
    /* Speculative decoding: NULL = the deployment file's speculator, if any, else none. */
    const char *speculator;   /* speculator plugin name */
    uint32_t draft_tokens;    /* 0 = the file's, else RLX_RUNTIME_DEFAULT_DRAFT_TOKENS; at most RLX_SPEC_MAX_DRAFT */
    const char *draft_model;  /* the draft model directory (the plugin's option model=DIR); may be NULL */
    const char *spec_options; /* the speculator's "key=value,..." options; may be NULL */
    /* Pipelines. Without a deployment, n_stages > 0 drives stages at these addresses and layer
     * ranges (for stages the caller launched itself). */
    const rlx_driver_stage *stages;
    uint32_t n_stages;
    const char *transport;            /* transport plugin; NULL = the file's, else tcp */
    uint32_t connect_timeout_ms;      /* 0 = the file's, else RLX_DIST_CONNECT_TIMEOUT_MS */
    uint32_t timeout_ms;              /* 0 = the file's, else RLX_DIST_TIMEOUT_MS */
    uint32_t compute_ms_per_position; /* 0 = the file's, else RLX_DIST_COMPUTE_MS_PER_POSITION */
    /* Local runs: when set, the weights of the model are read in before the session is made,
     * with progress called (bytes done, total) as it goes; otherwise pages fault in lazily. */
    void (*progress)(void *ctx, size_t done, size_t total);
    void *progress_ctx;
    /* Local runs and stages of a safetensors model: quantize its matrices in memory to this
     * type (rlx_model_quantize) before the session is made; NULL or "" for none. */
    const char *quant;
    /* Local runs and stages: the KV cache's rlx_dtype, RLX_DTYPE_F32 (0) or RLX_DTYPE_F16. */
    uint32_t kv_dtype;
    /* Pipelines: > 0 makes every stage keep this many sequences of kv_capacity positions for
     * the batched engine (rlx_driver_options.n_slots, rlx_engine_create_pipeline). */
    uint32_t n_slots;
    /* Pipelines: recovery of a lost stage (rlx_driver_options): 0 = the file's, else
     * RLX_DIST_RECOVERY_TIMEOUT_MS; no_recovery = 1 turns it off; restart (may be NULL) starts
     * a replacement of a stage the caller launched. */
    uint32_t recovery_timeout_ms;
    uint32_t no_recovery;
    rlx_driver_restart_fn stage_restart;
    void *stage_restart_ctx;
    /* Pipelines: the credentials the stages require; each field left NULL takes the deployment
     * file's (rlx_deploy_security), if any. */
    rlx_dist_security security;
    /* Local runs and stages: every node's output is checked as it runs, and the first NaN or
     * infinity stops the forward naming the node (rlx_session_options.check_finite). */
    uint32_t check_finite;
} rlx_runtime_options;

/* Zeroes with size set: the model alone on cpu-blas, no speculator. */
RLX_API rlx_runtime_options rlx_runtime_options_default(void);

/* Opens the runtime that opts describe: the speculator's plugin first (so that a speculator
 * needing the target's hidden states gets an lm that returns them), then either the pipeline
 * driver (a deployment or stages) or the backends, the model and a whole-model session, then
 * the speculator over them. On success the caller owns *out (rlx_runtime_close). On failure
 * *out is NULL, everything opened is closed again, and the message names what failed: a
 * backend, the model, a placement item, the transport, a stage, the speculator (an unknown
 * speculator lists the ones available). A size smaller than the first members (through
 * n_backends), a deployment with RLX_RUNTIME_STAGE, no model, or a draft_tokens above
 * RLX_SPEC_MAX_DRAFT is RLX_E_INVALID. Not thread-safe with other calls on the same runtime. */
RLX_API rlx_status rlx_runtime_open(const rlx_runtime_options *opts, rlx_runtime **out);
/* Closes the speculator, the session or driver, the backends and then the model. NULL is a no-op. */
RLX_API void rlx_runtime_close(rlx_runtime *rt);

/* Everything below is borrowed from rt until rlx_runtime_close. */

/* What to generate with: the local session, or the pipeline driver (NULL with RLX_RUNTIME_STAGE). */
RLX_API const rlx_lm *rlx_runtime_lm(const rlx_runtime *rt);
/* The whole-model session of a local run, NULL otherwise. */
RLX_API rlx_session *rlx_runtime_session(const rlx_runtime *rt);
/* The model of a local run or a stage, NULL over a pipeline (the stages hold the weights). */
RLX_API const rlx_model *rlx_runtime_model(const rlx_runtime *rt);
/* The pipeline driver, NULL for a local run. */
RLX_API rlx_driver *rlx_runtime_driver(const rlx_runtime *rt);
RLX_API const char *rlx_runtime_model_dir(const rlx_runtime *rt);
/* The model's configuration (read from the model, or by the driver). */
RLX_API const rlx_model_config *rlx_runtime_config(const rlx_runtime *rt);
/* The deployment the runtime drives, NULL when none. */
RLX_API const rlx_deploy *rlx_runtime_deploy(const rlx_runtime *rt);
/* The backend instances: the preference list first (an entry "ref" without options has no
 * instance: the reference kernels are the fallback), then those only placement named. Over a
 * pipeline there are none, unless a speculator drafts in this process (then the same). */
RLX_API size_t rlx_runtime_n_backends(const rlx_runtime *rt);
RLX_API rlx_backend *rlx_runtime_backend_at(const rlx_runtime *rt, size_t i); /* NULL past the end */
/* The first backend of the preference list, NULL when that is the plain reference kernels. */
RLX_API rlx_backend *rlx_runtime_main_backend(const rlx_runtime *rt);
/* The placement rules the session (and a stage, and a speculator) plan with. */
RLX_API const rlx_place_rule *rlx_runtime_rules(const rlx_runtime *rt, size_t *n_rules);
/* The speculator, NULL when none was asked for; and its draft tokens per round (0 without). */
RLX_API rlx_speculator *rlx_runtime_speculator(const rlx_runtime *rt);
RLX_API uint32_t rlx_runtime_draft_tokens(const rlx_runtime *rt);

/* For a runtime opened with RLX_RUNTIME_STAGE: serves block `so->layers` of its model as
 * rlx_stage_serve does, on the runtime's backends and placement (so->session's backends, rules
 * and, when 0, kv_capacity are taken from the runtime; so->backend_name from its main backend),
 * over the transport plugin `transport` (NULL = tcp), which it loads and unloads. */
RLX_API rlx_status rlx_runtime_serve_stage(rlx_runtime *rt, const char *transport, const rlx_stage_options *so);

#ifdef __cplusplus
}
#endif
#endif
