/* The MTP speculator: a multi-token-prediction head (DeepSeek-V3 / MiMo style, see
 * core/include/rlx/model.h) on top of the target drafts from the target's final hidden states.
 *
 * Weights: the target's model directory is opened again (its safetensors are mapped, so this
 * costs no memory beyond page tables) and MTP layer N (option layer=N, default 0) is looked up
 *   1. in the model's own safetensors (MiMo ships model.mtp_layers.* with the model);
 *   2. else in the file of option weights=FILE;
 *   3. else in mtp.safetensors in the model directory, when present.
 * Giving weights=FILE for a model that already holds the tensors is an error (a name in two
 * files). Without any, opening fails naming the first missing tensor.
 *
 * The MTP layer has its own KV cache, whose entry p is the pair (token x[p+1], hidden h[p]).
 * The entries up to `true_length` come from the target's real hidden states; drafting appends
 * entries made from the head's own output instead (a stand-in for h the target has not
 * computed yet). Each propose() drops those, appends the update's real pairs in one forward,
 * drafts the first token from the last pair's logits, then chains: the head's output row
 * becomes the next h, paired with the token just drafted, one forward per further token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "plugin_entry.h"
#include "rlx/rlx.h"
#include "rlx/speculator_iface.h"

typedef struct mtp {
    const rlx_host *host;
    rlx_model *model;
    rlx_session *session;
    int64_t vocab, hidden_size;
    uint32_t true_length; /* cache entries made from the target's hidden states */
    float *chain_hidden;  /* [hidden_size]: the head's output row fed back while chaining */
    rlx_sampler *sampler; /* made at the first propose() of a sequence, for its parameters */
    rlx_sampler_params sampling;
} mtp;

typedef struct mtp_options {
    char weights[4096]; /* empty: not given */
    uint32_t layer;
} mtp_options;

/* Reads "weights=FILE" and "layer=N" from "k=v,k=v"; a negative status after host->error. */
static int mtp_parse_options(const rlx_host *host, const char *options, mtp_options *o) {
    const char *cursor = options;
    rlx_iface_option item;
    char err[256];
    long long layer;
    int rc;
    while ((rc = rlx_iface_option_next(&cursor, &item, err, sizeof err)) > 0) {
        if (rlx_iface_option_is(&item, "weights")) {
            if (item.value_len >= sizeof o->weights)
                return host->error(RLX_E_INVALID, "option weights needs a file name of 1 to %zu bytes",
                                   sizeof o->weights - 1);
            memcpy(o->weights, item.value, item.value_len + 1);
        } else if (rlx_iface_option_is(&item, "layer")) {
            if (!rlx_iface_option_int(&item, 0, RLX_MAX_LAYERS - 1, &layer))
                return host->error(RLX_E_INVALID, "option layer needs an MTP layer number below %d, not '%s'",
                                   RLX_MAX_LAYERS, item.value);
            o->layer = (uint32_t)layer;
        } else {
            return host->error(RLX_E_INVALID, "unknown option '%.*s' (known: weights, layer)", (int)item.key_len,
                               item.key);
        }
    }
    return rc < 0 ? host->error(rc, "%s (known: weights, layer)", err) : RLX_OK;
}

static void mtp_close(void *self) {
    mtp *s = self;
    if (!s)
        return;
    rlx_sampler_destroy(s->sampler);
    rlx_session_destroy(s->session);
    rlx_model_close(s->model);
    free(s->chain_hidden);
    free(s);
}

/* Makes MTP layer `layer` available to the model, in the order the file comment gives. */
static int mtp_find_weights(mtp *s, const char *dir, const mtp_options *o) {
    if (rlx_model_has_mtp(s->model, o->layer) && !o->weights[0])
        return RLX_OK;
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/mtp.safetensors", dir);
    const char *file = o->weights[0] ? o->weights : stat(path, &st) == 0 ? path : NULL;
    int rc = file ? rlx_model_add_weights(s->model, file) : RLX_OK;
    /* without a file the tensors are still missing: creating the session names them */
    return rc == RLX_OK ? RLX_OK : s->host->error(rc, "MTP weights: %s", rlx_last_error());
}

static int mtp_open(const rlx_host *host, const rlx_spec_target *target, void **self) {
    *self = NULL;
    if (!target->model_dir)
        return host->error(RLX_E_INVALID, "the MTP speculator needs the target's model directory");
    mtp_options o = {0};
    int rc = mtp_parse_options(host, target->options, &o);
    if (rc != RLX_OK)
        return rc;
    mtp *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(RLX_E_NOMEM, "out of memory");
    s->host = host;
    if ((rc = rlx_model_open(target->model_dir, &s->model)) != RLX_OK) {
        rc = host->error(rc, "cannot open the target model: %s", rlx_last_error());
        goto fail;
    }
    const rlx_model_config *c = rlx_model_config_of(s->model);
    if (c->vocab_size != target->vocab || c->hidden_size != target->hidden_size) {
        rc = host->error(RLX_E_INVALID, "%s has vocabulary %lld and hidden size %lld, the target %lld and %lld",
                         target->model_dir, (long long)c->vocab_size, (long long)c->hidden_size,
                         (long long)target->vocab, (long long)target->hidden_size);
        goto fail;
    }
    if ((rc = mtp_find_weights(s, target->model_dir, &o)) != RLX_OK)
        goto fail;
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_start = o.layer,
                           .layer_end = o.layer + 1,
                           .embed_input = 1,
                           .produce_logits = 1,
                           .emit_hidden = 1,
                           .mtp = 1};
    rlx_session_options so = {.size = sizeof(rlx_session_options),
                              .kv_capacity = target->kv_capacity,
                              .backends = target->backends,
                              .n_backends = target->n_backends,
                              .rules = target->rules,
                              .n_rules = target->n_rules};
    if ((rc = rlx_session_create(s->model, &spec, &so, &s->session)) != RLX_OK) {
        rc = host->error(rc, "%s", rlx_last_error());
        goto fail;
    }
    s->vocab = c->vocab_size;
    s->hidden_size = c->hidden_size;
    if (!(s->chain_hidden = malloc((size_t)s->hidden_size * sizeof *s->chain_hidden))) {
        rc = host->error(RLX_E_NOMEM, "out of memory");
        goto fail;
    }
    *self = s;
    return RLX_OK;
fail:
    mtp_close(s);
    return rc;
}

static int mtp_reset(void *self) {
    mtp *s = self;
    s->true_length = 0;
    rlx_sampler_destroy(s->sampler);
    s->sampler = NULL;
    return rlx_session_truncate(s->session, 0);
}

/* The sampler for these parameters, on a generator stream apart from the target's but fixed by
 * the seed, so a run is reproducible. */
static int mtp_sampler(mtp *s, const rlx_sampler_params *sampling) {
    /* the core's parameters may be another version's: read them as this plugin's */
    const rlx_sampler_params given = rlx_sampler_params_read(sampling);
    if (s->sampler && memcmp(&s->sampling, &given, sizeof given) == 0)
        return RLX_OK;
    rlx_sampler_destroy(s->sampler);
    s->sampler = NULL;
    rlx_sampler_params p = given;
    p.seed ^= 0x9e3779b97f4a7c15ull;
    int rc = rlx_sampler_create(&p, s->vocab, &s->sampler);
    if (rc == RLX_OK)
        s->sampling = given;
    return rc;
}

/* Draws a token from logits, writing the distribution it came from to row. */
static int mtp_draw(mtp *s, const float *logits, float *row, int32_t *token) {
    rlx_sampler_probs(s->sampler, logits, row);
    *token = rlx_sampler_draw(s->sampler, row);
    return *token < 0 ? RLX_E_INVALID : RLX_OK;
}

static int mtp_propose(void *self, const rlx_spec_update *update, uint32_t k, const rlx_sampler_params *sampling,
                       int32_t *tokens, float *probs, uint32_t *n_proposed) {
    mtp *s = self;
    *n_proposed = 0;
    if (update->n_hidden > update->n_tokens || (update->n_hidden && !update->hidden))
        return s->host->error(RLX_E_INVALID, "MTP speculator: %u hidden rows for %u new tokens", update->n_hidden,
                              update->n_tokens);
    int rc = mtp_sampler(s, sampling);
    if (rc != RLX_OK)
        return rc;
    /* entries drafted from the head's own hidden rows go; the update's real pairs replace them
     * (accepted drafts included: their pairs now use the target's true hidden states) */
    if ((rc = rlx_session_truncate(s->session, s->true_length)) != RLX_OK)
        return rc;
    uint32_t n_pairs = update->n_hidden, capacity = rlx_session_capacity(s->session);
    if (n_pairs == 0 || n_pairs > capacity - s->true_length)
        return RLX_OK; /* nothing new to draft from, or past the context */
    const int32_t *pair_tokens = update->tokens + (update->n_tokens - n_pairs);
    const float *logits;
    rc = rlx_session_forward_mtp(s->session, pair_tokens, update->hidden, n_pairs, 0, &logits);
    if (rc != RLX_OK)
        return rc;
    s->true_length += n_pairs;
    size_t h = (size_t)s->hidden_size, v = (size_t)s->vocab;
    const float *out_hidden = rlx_session_hidden(s->session) + (size_t)(n_pairs - 1) * h;
    uint32_t n = 0;
    for (;;) {
        if ((rc = mtp_draw(s, logits, probs + (size_t)n * v, &tokens[n])) != RLX_OK)
            return rc;
        n++;
        if (n == k || rlx_session_length(s->session) == capacity)
            break;
        /* the head's output at the last pair stands in for the target's next hidden state */
        memcpy(s->chain_hidden, out_hidden, h * sizeof *s->chain_hidden);
        if ((rc = rlx_session_forward_mtp(s->session, &tokens[n - 1], s->chain_hidden, 1, 0, &logits)) != RLX_OK)
            return rc;
        out_hidden = rlx_session_hidden(s->session);
    }
    *n_proposed = n;
    return RLX_OK;
}

static const rlx_speculator_iface mtp_iface = {
    .size = sizeof(rlx_speculator_iface),
    .flags = RLX_SPEC_NEEDS_HIDDEN,
    .open = mtp_open,
    .close = mtp_close,
    .reset = mtp_reset,
    .propose = mtp_propose,
};

static const rlx_plugin mtp_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_SPECULATOR,
    .name = "mtp",
    .version = "0.1.0",
    .summary = "multi-token-prediction head on the target's hidden states (options weights=FILE, layer=N)",
    .iface = &mtp_iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return plugin_entry(host, &mtp_plugin); }
