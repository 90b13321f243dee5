/* A frozen copy of what a speculator plugin saw of the rlx headers in their first sized version:
 * rlx_sampler_params before min_p and the penalties were appended, rlx_session_options before
 * placement rules, rlx_block_spec before all_logits, emit_hidden and mtp. old_speculator.c builds against this instead of rlx/rlx.h, as a plugin built
 * against an older librlx would, so the test sees the core read only what these sizes cover.
 * Never update it: it stands for binaries already out there. */
#ifndef RLX_FROZEN_SPECULATOR_ABI_1_H
#define RLX_FROZEN_SPECULATOR_ABI_1_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rlx/plugin_iface.h"

typedef struct rlx_model rlx_model;

/* the first members of the model configuration, all this plugin reads */
typedef struct rlx_model_config {
    char model_type[32];
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
} rlx_model_config;

/* before all_logits, emit_hidden and mtp were appended */
typedef struct rlx_block_spec {
    uint32_t size;
    uint32_t layer_start;
    uint32_t layer_end;
    uint32_t embed_input;
    uint32_t produce_logits;
} rlx_block_spec;

#define RLX_SPEC_MAX_DRAFT 64

typedef struct rlx_session rlx_session;
typedef struct rlx_sampler rlx_sampler;
typedef struct rlx_backend rlx_backend;
typedef struct rlx_place_rule rlx_place_rule;

typedef struct rlx_session_options {
    uint32_t size;
    uint32_t kv_capacity;
    rlx_backend *const *backends;
    size_t n_backends;
} rlx_session_options;

typedef struct rlx_sampler_params {
    uint32_t size;
    int greedy;
    float temperature;
    int32_t top_k;
    float top_p;
    uint64_t seed;
} rlx_sampler_params;

static inline rlx_sampler_params rlx_sampler_params_read(const rlx_sampler_params *src)
{
    rlx_sampler_params p = {.size = sizeof p, .temperature = 1.0f, .top_p = 1.0f};
    memcpy(&p, src, src->size < sizeof p ? src->size : sizeof p);
    p.size = sizeof p;
    return p;
}

typedef struct rlx_spec_target {
    uint32_t size;
    uint32_t kv_capacity;
    const char *model_dir;
    int64_t vocab;
    int64_t hidden_size;
    rlx_backend *const *backends;
    size_t n_backends;
    const rlx_place_rule *rules;
    size_t n_rules;
    const char *options;
} rlx_spec_target;

typedef struct rlx_spec_update {
    uint32_t size;
    const int32_t *tokens;
    uint32_t n_tokens;
    uint32_t n_accepted;
    const float *hidden;
    uint32_t n_hidden;
} rlx_spec_update;

typedef struct rlx_speculator_iface {
    uint32_t size;
    uint32_t flags;
    int (*open)(const rlx_host *host, const rlx_spec_target *target, void **self);
    void (*close)(void *self);
    int (*reset)(void *self);
    int (*propose)(void *self, const rlx_spec_update *update, uint32_t k, const rlx_sampler_params *sampling,
                   int32_t *tokens, float *probs, uint32_t *n_proposed);
} rlx_speculator_iface;

int rlx_model_open(const char *model_dir, rlx_model **out);
void rlx_model_close(rlx_model *m);
const rlx_model_config *rlx_model_config_of(const rlx_model *m);
int rlx_session_create(const rlx_model *m, const rlx_block_spec *spec, const rlx_session_options *opts,
                       rlx_session **out);
void rlx_session_destroy(rlx_session *s);
int rlx_session_forward(rlx_session *s, const void *input, uint32_t n, int all_rows, const float **out);
int rlx_session_truncate(rlx_session *s, uint32_t length);
int rlx_sampler_create(const rlx_sampler_params *p, int64_t vocab, rlx_sampler **out);
void rlx_sampler_destroy(rlx_sampler *s);
void rlx_sampler_probs(rlx_sampler *s, const float *logits, float *probs);
int32_t rlx_sampler_draw(rlx_sampler *s, const float *probs);

#endif
