/* Deployment files: which model, which transport, and the pipeline's stages (YAML).
 *
 *   model: models/qwen3-0.6b      # relative paths are relative to the file's folder
 *   transport: grpc               # transport plugin name; default tcp
 *   stages:                       # in pipeline order: the first embeds tokens, the last makes logits
 *     - address: 127.0.0.1:7101   # host:port the driver connects to
 *       backend: onednn           # backend plugin of this stage (default: the command line's)
 *       layers: 0-13              # optional, inclusive; all stages or none (then split by weights)
 *       threads: 2                # optional
 *       backend_options: "isa=avx2"   # optional: the backend's "key=value,..." options
 *       listen: 0.0.0.0:7101      # optional: what the stage binds, if not address
 *       standby: [10.0.0.5:7101]  # optional: stand-by stages for the same layers, tried in order
 *                                 # when the stage is lost (one address, or a list of at most
 *                                 # RLX_DIST_MAX_STANDBY); each is a process of its own
 *     - address: 127.0.0.1:7102
 *       backend: cpu-blas
 *   speculator: {plugin: draft, draft_tokens: 4, draft_model: models/qwen3-draft}   # optional;
 *                                 # also options: "key=value,..." for the plugin
 *   generation: {max_tokens: 64, temperature: 0.7, top_k: 20, top_p: 0.8, seed: 1}  # optional; also
 *                                 # min_p, repeat_penalty, repeat_last_n, presence_penalty and
 *                                 # frequency_penalty, as in rlx_sampler_params (gen.h)
 *   timeouts: {connect_ms: 10000, control_ms: 5000, per_position_ms: 100,          # optional
 *              recovery_ms: 30000, idle_ms: 120000}
 *   auth: {token_file: secrets/pipeline.token}   # optional: the shared token (rlx_dist_security)
 *   tls: {ca: pki/ca.pem, cert: pki/node.pem, key: pki/node.key}   # optional: mutual TLS, the
 *                                 # three together; also name: the name stages' certificates
 *                                 # carry, if not their host (the driver's concern)
 *   limits: {connections: 16, sessions: 64, positions: 262144}     # optional: each stage's
 * and in a stage's entry, optionally, its own certificate: tls: {cert: pki/s0.pem, key: pki/s0.key}
 * (both; it needs the top-level tls: for the ca). The files are not read here: the core reads
 * them when a stage serves or a driver connects.
 *
 * Unknown or repeated keys, wrong types, empty values, a missing or empty stage list, malformed
 * addresses, standby addresses that repeat an address or another standby, layer ranges that
 * leave a gap or overlap, an incomplete tls: or auth:, and a stage's tls: without the file's are
 * RLX_E_FORMAT with "FILE:LINE: " in the message.
 * Command-line flags override the file; the application applies them. */
#ifndef RLX_DEPLOY_H
#define RLX_DEPLOY_H

#include <stdint.h>

#include "rlx/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlx_deploy rlx_deploy;

typedef struct rlx_deploy_stage {
    const char *address;         /* "host:port" the driver connects to */
    const char *listen;          /* what the stage binds; the address when not given */
    const char *backend;         /* backend plugin name, NULL when not given */
    const char *backend_options; /* the backend's "key=value,..." options, NULL when not given */
    int has_layers;              /* layers was given */
    rlx_layer_range layers;      /* [start, end) when has_layers */
    uint32_t threads;            /* 0 when not given */
    uint32_t line;               /* line of the stage's entry in the file (1-based) */
    /* Stand-by stages serving the same layers, in the file's order: addresses checked as
     * address is, distinct from every stage's address and from each other. NULL and 0 when
     * not given. */
    const char *const *standby;
    uint32_t n_standby; /* at most RLX_DIST_MAX_STANDBY */
    /* The stage's own certificate and key (tls: {cert, key} in its entry), resolved against the
     * file's folder; NULL when not given (the file's tls: cert and key then serve). */
    const char *tls_cert, *tls_key;
} rlx_deploy_stage;

typedef struct rlx_deploy_speculator {
    const char *plugin;
    uint32_t draft_tokens;   /* 0 when not given */
    const char *draft_model; /* the draft's model directory, resolved like model; NULL when not given */
    const char *options;     /* the plugin's "key=value,..." options; NULL when not given */
} rlx_deploy_speculator;

/* Generation defaults; each has_ flag says whether the file gave the value. The values are
 * checked as rlx_sampler_create checks them. */
typedef struct rlx_deploy_generation {
    int has_max_tokens, has_temperature, has_top_k, has_top_p, has_seed;
    uint32_t max_tokens;
    float temperature; /* >= 0; 0 = greedy */
    int32_t top_k;
    float top_p; /* (0, 1] */
    uint64_t seed;
    int has_min_p, has_repeat_penalty, has_repeat_last_n, has_presence_penalty, has_frequency_penalty;
    float min_p;             /* [0, 1] */
    float repeat_penalty;    /* > 0 */
    int32_t repeat_last_n;   /* >= -1 (-1 = the whole context) */
    float presence_penalty;  /* finite, any sign */
    float frequency_penalty; /* finite, any sign */
} rlx_deploy_generation;

/* Milliseconds; 0 when not given (the rlx_driver_options defaults then apply). */
typedef struct rlx_deploy_timeouts {
    uint32_t connect_ms, control_ms, per_position_ms;
    uint32_t recovery_ms; /* replacing a lost stage and replaying its streams; 0 when not given */
    uint32_t idle_ms;     /* a stage closes a connection silent this long; 0 when not given */
} rlx_deploy_timeouts;

/* The stages' limits (rlx_stage_options); 0 when not given. */
typedef struct rlx_deploy_limits {
    uint32_t connections, sessions;
    uint64_t positions;
} rlx_deploy_limits;

/* Parses and checks the file at path. On success the caller owns *out (rlx_deploy_close). */
RLX_API rlx_status rlx_deploy_open(const char *path, rlx_deploy **out);
RLX_API void rlx_deploy_close(rlx_deploy *d); /* NULL is a no-op */

/* Every string returned below is borrowed from d. */
RLX_API const char *rlx_deploy_path(const rlx_deploy *d);
/* The model directory, resolved against the file's folder; NULL when the file names none. */
RLX_API const char *rlx_deploy_model(const rlx_deploy *d);
RLX_API const char *rlx_deploy_transport(const rlx_deploy *d); /* "tcp" when not given */
RLX_API uint32_t rlx_deploy_n_stages(const rlx_deploy *d);
RLX_API const rlx_deploy_stage *rlx_deploy_stage_at(const rlx_deploy *d, uint32_t i); /* NULL past the end */
RLX_API const rlx_deploy_speculator *rlx_deploy_speculator_of(const rlx_deploy *d);   /* NULL when absent */
RLX_API const rlx_deploy_generation *rlx_deploy_generation_of(const rlx_deploy *d);
RLX_API const rlx_deploy_timeouts *rlx_deploy_timeouts_of(const rlx_deploy *d);
RLX_API const rlx_deploy_limits *rlx_deploy_limits_of(const rlx_deploy *d);
/* The deployment's credentials (auth: and tls:) for the driver (stage < 0) or for stage `stage`
 * (its entry's tls: cert and key in place of the file's, when given; no tls_name, which is the
 * driver's); paths resolved against the file's folder and borrowed from d, NULL when not given.
 * insecure_listen is left 0. rlx_deploy_open checked that every stage has a complete set when
 * the file has tls:, so this fails only for a stage past the end (RLX_E_INVALID). */
RLX_API rlx_status rlx_deploy_security(const rlx_deploy *d, int stage, rlx_dist_security *out);

/* The layer range of every stage (out[n_stages]) for the model of cfg: the file's ranges,
 * checked to cover the model exactly, or rlx_dist_split_balanced when the file gives none.
 * Failures name the file, the line and the stage. */
RLX_API rlx_status rlx_deploy_layers(const rlx_deploy *d, const rlx_model_config *cfg, rlx_layer_range *out);

/* The stages as a pipeline driver takes them (out[n_stages]): each one's address, standby
 * addresses, its layers as rlx_deploy_layers gives them and the file and line that configure it
 * (strings borrowed from d).
 * Fails as rlx_deploy_layers does. */
RLX_API rlx_status rlx_deploy_driver_stages(const rlx_deploy *d, const rlx_model_config *cfg, rlx_driver_stage *out);

/* Checks "host:port": an IPv4 dotted quad, a host name or [IPv6], and a port in 1..65535
 * (0 too with allow_port_0). */
RLX_API rlx_status rlx_deploy_check_address(const char *address, int allow_port_0);

#ifdef __cplusplus
}
#endif
#endif
