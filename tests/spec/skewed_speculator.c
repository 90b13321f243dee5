/* A test speculator whose drafts ignore the context: each is drawn independently from a fixed
 * distribution q with q(j) = 4 for j % 3 == 0 and 1 otherwise (normalised), deliberately unlike
 * any model's. The acceptance rule must turn its drafts into the target's distribution anyway.
 * Option mode= breaks its answers on purpose so the core's checks can be seen refusing them:
 * out_of_vocab, zero_prob, too_many, negative. */
#include <stdlib.h>
#include <string.h>

#include "rlx/rlx.h"

typedef struct skewed {
    const rlx_host *host;
    int64_t vocab;
    char mode[32];
    rlx_sampler *sampler; /* drawn at the first propose() after reset, from its seed */
} skewed;

static void skewed_close(void *self) {
    skewed *s = self;
    if (s)
        rlx_sampler_destroy(s->sampler);
    free(s);
}

static int skewed_open(const rlx_host *host, const rlx_spec_target *target, void **self) {
    skewed *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(RLX_E_NOMEM, "out of memory");
    s->host = host;
    s->vocab = target->vocab;
    strcpy(s->mode, "ok");
    const char *o = target->options;
    if (o && *o) {
        if (strncmp(o, "mode=", 5) != 0 || strlen(o + 5) >= sizeof s->mode) {
            free(s);
            return host->error(RLX_E_INVALID, "unknown option '%s' (known: mode)", o);
        }
        strcpy(s->mode, o + 5);
    }
    *self = s;
    return RLX_OK;
}

static int skewed_reset(void *self) {
    skewed *s = self;
    rlx_sampler_destroy(s->sampler);
    s->sampler = NULL;
    return RLX_OK;
}

static int skewed_propose(void *self, const rlx_spec_update *update, uint32_t k, const rlx_sampler_params *sampling,
                          int32_t *tokens, float *probs, uint32_t *n_proposed) {
    skewed *s = self;
    (void)update;
    if (!s->sampler) {
        rlx_sampler_params p = rlx_sampler_params_default();
        p.seed = sampling->seed ^ 0x5bd1e995u;
        int rc = rlx_sampler_create(&p, s->vocab, &s->sampler);
        if (rc != RLX_OK)
            return rc;
    }
    double total = 0;
    for (int64_t j = 0; j < s->vocab; j++)
        total += j % 3 == 0 ? 4 : 1;
    for (uint32_t i = 0; i < k; i++) {
        float *row = probs + (size_t)i * (size_t)s->vocab;
        for (int64_t j = 0; j < s->vocab; j++)
            row[j] = (float)((j % 3 == 0 ? 4 : 1) / total);
        tokens[i] = rlx_sampler_draw(s->sampler, row);
    }
    *n_proposed = k;
    if (strcmp(s->mode, "out_of_vocab") == 0)
        tokens[0] = (int32_t)s->vocab;
    else if (strcmp(s->mode, "zero_prob") == 0)
        probs[tokens[0]] = 0;
    else if (strcmp(s->mode, "negative") == 0)
        probs[tokens[0] == 0 ? 1 : 0] = -0.5f;
    else if (strcmp(s->mode, "too_many") == 0)
        *n_proposed = k + 1;
    return RLX_OK;
}

static const rlx_speculator_iface skewed_iface = {
    .size = sizeof(rlx_speculator_iface),
    .open = skewed_open,
    .close = skewed_close,
    .reset = skewed_reset,
    .propose = skewed_propose,
};

static const rlx_plugin skewed_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_SPECULATOR,
    .name = "skewed",
    .version = "0.0.0",
    .summary = "test speculator: context-free drafts from a fixed skewed distribution",
    .iface = &skewed_iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    (void)host;
    return &skewed_plugin;
}
