/* The draft-model speculator: a smaller Qwen3 with the target's tokenizer proposes the next
 * tokens autoregressively on its own KV cache.
 *
 * The cache is advanced incrementally. After a proposal it holds the accepted context plus the
 * drafts fed back while drafting; the next propose() truncates it to the longest prefix the new
 * accepted context shares with it (the accepted drafts stay), feeds only the tokens after that
 * prefix in one forward, and drafts from there. Options: model=DIR (required). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_entry.h"
#include "rlx/rlx.h"
#include "rlx/speculator_iface.h"

typedef struct draft {
    const rlx_host *host;
    rlx_model *model;
    rlx_session *session;
    int64_t vocab;
    char dir[4096];
    /* the accepted context so far */
    int32_t *context;
    uint32_t n_context, context_cap;
    int32_t *cached;      /* [capacity]: the tokens at the cache's positions [0, length) */
    rlx_sampler *sampler; /* made at the first propose() of a sequence, for its parameters */
    rlx_sampler_params sampling;
} draft;

/* Reads "model=DIR" (the only option) from "k=v,k=v" into dir; 1 when given, 0 when absent, -1
 * after an error. */
static int draft_parse_options(const rlx_host *host, const char *options, char *dir, size_t size) {
    const char *cursor = options;
    rlx_iface_option o;
    char err[256];
    int found = 0, rc;
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0) {
        if (!rlx_iface_option_is(&o, "model"))
            return host->error(RLX_E_INVALID, "unknown option '%.*s' (known: model)", (int)o.key_len, o.key), -1;
        if (o.value_len >= size)
            return host->error(RLX_E_INVALID, "option model needs a directory name of 1 to %zu bytes", size - 1), -1;
        memcpy(dir, o.value, o.value_len + 1);
        found = 1;
    }
    return rc < 0 ? (host->error(rc, "%s (known: model)", err), -1) : found;
}

/* 1 when both files exist and differ, 0 when they are identical or either is missing. */
static int draft_files_differ(const char *a_path, const char *b_path) {
    FILE *a = fopen(a_path, "rb"), *b = a ? fopen(b_path, "rb") : NULL;
    int differ = 0;
    if (a && b) {
        char x[65536], y[65536];
        size_t na, nb;
        do {
            na = fread(x, 1, sizeof x, a);
            nb = fread(y, 1, sizeof y, b);
            differ = na != nb || memcmp(x, y, na) != 0;
        } while (!differ && na == sizeof x);
    }
    if (a)
        fclose(a);
    if (b)
        fclose(b);
    return differ;
}

static void draft_close(void *self) {
    draft *d = self;
    if (!d)
        return;
    rlx_sampler_destroy(d->sampler);
    rlx_session_destroy(d->session);
    rlx_model_close(d->model);
    free(d->context);
    free(d->cached);
    free(d);
}

static int draft_open(const rlx_host *host, const rlx_spec_target *target, void **self) {
    *self = NULL;
    draft *d = calloc(1, sizeof *d);
    if (!d)
        return host->error(RLX_E_NOMEM, "out of memory");
    d->host = host;
    int found = draft_parse_options(host, target->options, d->dir, sizeof d->dir);
    int rc = RLX_OK;
    if (found <= 0) {
        rc = found < 0 ? RLX_E_INVALID
                       : host->error(RLX_E_INVALID, "no draft model given (option model=DIR, or --draft-model "
                                                    "DIR)");
        goto fail;
    }
    if ((rc = rlx_model_open(d->dir, &d->model)) != RLX_OK) {
        rc = host->error(rc, "cannot open the draft model: %s", rlx_last_error());
        goto fail;
    }
    const rlx_model_config *c = rlx_model_config_of(d->model);
    if (c->vocab_size != target->vocab) {
        rc = host->error(RLX_E_INVALID,
                         "the draft model %s has a vocabulary of %lld tokens, the target %s has "
                         "%lld: a draft must share the target's tokenizer",
                         d->dir, (long long)c->vocab_size, target->model_dir ? target->model_dir : "",
                         (long long)target->vocab);
        goto fail;
    }
    if (target->model_dir) {
        char mine[4200], theirs[4200];
        snprintf(mine, sizeof mine, "%s/tokenizer.json", d->dir);
        snprintf(theirs, sizeof theirs, "%s/tokenizer.json", target->model_dir);
        if (draft_files_differ(mine, theirs)) {
            rc = host->error(RLX_E_INVALID, "%s differs from %s: a draft must share the target's tokenizer", mine,
                             theirs);
            goto fail;
        }
    }
    /* drafting never runs past the target's context; a draft trained on shorter contexts just
     * stops proposing when its own runs out */
    uint32_t capacity = target->kv_capacity;
    if (c->max_position_embeddings > 0 && (uint64_t)c->max_position_embeddings < capacity)
        capacity = (uint32_t)c->max_position_embeddings;
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1};
    rlx_session_options so = {.size = sizeof(rlx_session_options),
                              .kv_capacity = capacity,
                              .backends = target->backends,
                              .n_backends = target->n_backends,
                              .rules = target->rules,
                              .n_rules = target->n_rules};
    if ((rc = rlx_session_create(d->model, &spec, &so, &d->session)) != RLX_OK) {
        rc = host->error(rc, "%s: %s", d->dir, rlx_last_error());
        goto fail;
    }
    d->vocab = c->vocab_size;
    if (!(d->cached = malloc(capacity * sizeof *d->cached))) {
        rc = host->error(RLX_E_NOMEM, "out of memory");
        goto fail;
    }
    *self = d;
    return RLX_OK;
fail:
    draft_close(d);
    return rc;
}

static int draft_reset(void *self) {
    draft *d = self;
    d->n_context = 0;
    rlx_sampler_destroy(d->sampler);
    d->sampler = NULL;
    return rlx_session_truncate(d->session, 0);
}

static int draft_append_context(draft *d, const int32_t *tokens, uint32_t n) {
    if (d->n_context + n > d->context_cap) {
        uint32_t cap = d->context_cap ? d->context_cap : 256;
        while (cap < d->n_context + n)
            cap *= 2;
        int32_t *grown = realloc(d->context, cap * sizeof *grown);
        if (!grown)
            return d->host->error(RLX_E_NOMEM, "out of memory for a context of %u tokens", d->n_context + n);
        d->context = grown;
        d->context_cap = cap;
    }
    memcpy(d->context + d->n_context, tokens, n * sizeof *tokens);
    d->n_context += n;
    return RLX_OK;
}

/* The sampler for these parameters: its own generator, a stream apart from the target's but
 * fixed by the seed, so a run is reproducible. */
static int draft_sampler(draft *d, const rlx_sampler_params *sampling) {
    /* the core's parameters may be another version's: read them as this plugin's */
    const rlx_sampler_params given = rlx_sampler_params_read(sampling);
    if (d->sampler && memcmp(&d->sampling, &given, sizeof given) == 0)
        return RLX_OK;
    rlx_sampler_destroy(d->sampler);
    d->sampler = NULL;
    rlx_sampler_params p = given;
    p.seed ^= 0xd1b54a32d192ed03ull;
    int rc = rlx_sampler_create(&p, d->vocab, &d->sampler);
    if (rc == RLX_OK)
        d->sampling = given;
    return rc;
}

static int draft_propose(void *self, const rlx_spec_update *update, uint32_t k, const rlx_sampler_params *sampling,
                         int32_t *tokens, float *probs, uint32_t *n_proposed) {
    draft *d = self;
    *n_proposed = 0;
    int rc = draft_append_context(d, update->tokens, update->n_tokens);
    if (rc == RLX_OK)
        rc = draft_sampler(d, sampling);
    if (rc != RLX_OK)
        return rc;
    uint32_t length = rlx_session_length(d->session), capacity = rlx_session_capacity(d->session);
    if (d->n_context == 0 || d->n_context > capacity)
        return RLX_OK; /* nothing to draft from, or past what the draft model holds */
    /* keep the longest cached prefix of the context (its accepted drafts included), and always
     * recompute the last context position: its logits give the first draft */
    uint32_t keep = 0;
    while (keep < length && keep < d->n_context - 1 && d->cached[keep] == d->context[keep])
        keep++;
    if ((rc = rlx_session_truncate(d->session, keep)) != RLX_OK)
        return rc;
    const float *logits;
    if ((rc = rlx_session_forward(d->session, d->context + keep, d->n_context - keep, 0, &logits)) != RLX_OK)
        return rc;
    memcpy(d->cached + keep, d->context + keep, (d->n_context - keep) * sizeof *d->cached);
    uint32_t n = 0;
    for (;;) {
        float *row = probs + (size_t)n * (size_t)d->vocab;
        rlx_sampler_probs(d->sampler, logits, row);
        int32_t token = rlx_sampler_draw(d->sampler, row);
        if (token < 0)
            return RLX_E_INVALID;
        tokens[n++] = token;
        length = rlx_session_length(d->session);
        if (n == k || length == capacity)
            break;
        if ((rc = rlx_session_forward(d->session, &token, 1, 0, &logits)) != RLX_OK)
            return rc;
        d->cached[length] = token;
    }
    *n_proposed = n;
    return RLX_OK;
}

static const rlx_speculator_iface draft_iface = {
    .size = sizeof(rlx_speculator_iface),
    .flags = 0,
    .open = draft_open,
    .close = draft_close,
    .reset = draft_reset,
    .propose = draft_propose,
};

static const rlx_plugin draft_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_SPECULATOR,
    .name = "draft",
    .version = "0.1.0",
    .summary = "draft-model speculator: a smaller Qwen3 with the target's tokenizer (option model=DIR)",
    .iface = &draft_iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return plugin_entry(host, &draft_plugin); }
