/* A speculator built against a frozen copy of an older speculator ABI (frozen/speculator_abi_1.h):
 * its rlx_sampler_params end after seed, its rlx_session_options before the placement rules and
 * its rlx_block_spec before all_logits.
 * It drafts with the target model itself: it recomputes the context in its own session, then
 * proposes greedy or sampled tokens from its own sampler. Each struct it hands the core is
 * followed by bytes of 0xff, so a core that read past the struct's size would find NaN
 * filters, a wild rules pointer or an MTP block and fail, not run. */
#include <stdlib.h>

#include "frozen/speculator_abi_1.h"

typedef struct old_spec {
    const rlx_host *host;
    rlx_model *model;
    rlx_session *session;
    int64_t vocab;
    int32_t *context; /* the accepted context */
    uint32_t n_context, capacity;
} old_spec;

static void old_close(void *self) {
    old_spec *s = self;
    if (!s)
        return;
    rlx_session_destroy(s->session);
    rlx_model_close(s->model);
    free(s->context);
    free(s);
}

static int old_open(const rlx_host *host, const rlx_spec_target *target, void **self) {
    old_spec *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(RLX_E_NOMEM, "out of memory");
    s->host = host;
    s->vocab = target->vocab;
    s->capacity = target->kv_capacity;
    int rc = rlx_model_open(target->model_dir, &s->model);
    if (rc != RLX_OK)
        return old_close(s), rc;
    struct {
        rlx_block_spec b;
        unsigned char poison[64];
    } spec;
    memset(&spec, 0xff, sizeof spec);
    spec.b = (rlx_block_spec){.size = sizeof spec.b,
                              .layer_end = (uint32_t)rlx_model_config_of(s->model)->num_hidden_layers,
                              .embed_input = 1,
                              .produce_logits = 1};
    struct {
        rlx_session_options o;
        unsigned char poison[64];
    } padded;
    memset(&padded, 0xff, sizeof padded);
    padded.o.size = sizeof padded.o;
    padded.o.kv_capacity = target->kv_capacity;
    padded.o.backends = target->backends;
    padded.o.n_backends = target->n_backends;
    if ((rc = rlx_session_create(s->model, &spec.b, &padded.o, &s->session)) != RLX_OK)
        return old_close(s), rc;
    if (!(s->context = malloc((size_t)s->capacity * sizeof *s->context)))
        return old_close(s), host->error(RLX_E_NOMEM, "out of memory");
    *self = s;
    return RLX_OK;
}

static int old_reset(void *self) {
    old_spec *s = self;
    s->n_context = 0;
    return rlx_session_truncate(s->session, 0);
}

static int old_propose(void *self, const rlx_spec_update *update, uint32_t k, const rlx_sampler_params *sampling,
                       int32_t *tokens, float *probs, uint32_t *n_proposed) {
    old_spec *s = self;
    *n_proposed = 0;
    /* the whole context is recomputed each round, so accepted drafts are plain new tokens here */
    if (s->n_context + update->n_tokens > s->capacity)
        return s->host->error(RLX_E_RANGE, "old: context past %u positions", s->capacity);
    memcpy(s->context + s->n_context, update->tokens, update->n_tokens * sizeof *tokens);
    s->n_context += update->n_tokens;
    struct {
        rlx_sampler_params p;
        unsigned char poison[64];
    } padded;
    memset(&padded, 0xff, sizeof padded);
    padded.p = rlx_sampler_params_read(sampling);
    rlx_sampler *sampler;
    int rc = rlx_sampler_create(&padded.p, s->vocab, &sampler);
    if (rc != RLX_OK)
        return rc;
    const float *logits;
    uint32_t n = s->n_context;
    rc = rlx_session_truncate(s->session, 0);
    for (uint32_t i = 0; rc == RLX_OK && i < k && n + i < s->capacity; i++) {
        rc = i == 0 ? rlx_session_forward(s->session, s->context, n, 0, &logits)
                    : rlx_session_forward(s->session, &tokens[i - 1], 1, 0, &logits);
        if (rc != RLX_OK)
            break;
        float *row = probs + (size_t)i * (size_t)s->vocab;
        rlx_sampler_probs(sampler, logits, row);
        if ((tokens[i] = rlx_sampler_draw(sampler, row)) < 0)
            rc = RLX_E_INVALID;
        else
            *n_proposed = i + 1;
    }
    rlx_sampler_destroy(sampler);
    return rc;
}

static const rlx_speculator_iface old_iface = {
    .size = sizeof(rlx_speculator_iface),
    .open = old_open,
    .close = old_close,
    .reset = old_reset,
    .propose = old_propose,
};

static const rlx_plugin old_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_SPECULATOR,
    .name = "old",
    .version = "1.0.0",
    .summary = "test: a speculator built against the first sized speculator ABI",
    .iface = &old_iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    (void)host;
    return &old_plugin;
}
