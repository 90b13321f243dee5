/* Speculative decoding: the wrapper that opens a speculator plugin and checks what it answers,
 * and rlx_spec_generate, which drafts with it and verifies on the target.
 *
 * The acceptance rule is the standard one (Leviathan et al. 2023; Chen et al. 2023): a draft d
 * drawn from q is kept with probability min(1, p(d) / q(d)); on rejection the token is drawn
 * from max(0, p - q) renormalised; when all k drafts are kept, a bonus token is drawn from the
 * target's row after them. Every emitted token is then distributed exactly as the target's
 * sampler would draw it, whatever q is; q only decides how many drafts survive.
 *
 * With penalties, p at verification row i depends on the tokens before it. Each emitted token
 * enters the sampler's history before the next row is judged, so row i sees the kept drafts
 * 0..i-1 exactly as plain decoding would have, and the rule stays exact. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec_internal.h"
#include "util/alloc.h"

#include "gen/gen_internal.h"
#include "util/clock.h"

struct rlx_speculator {
    const rlx_speculator_iface *iface;
    void *self;
    const char *name; /* the plugin descriptor's, alive as long as the plugin handle */
    int64_t vocab;
};

rlx_status rlx__speculator_check_iface(const char *what, const rlx_speculator_iface *sp) {
    if (!RLX_HAS(rlx_speculator_iface, sp, propose))
        return rlx_error(RLX_E_ABI, "%s: speculator table is %u bytes, too short for ABI %d (needs %zu)", what,
                         sp->size, RLX_ABI_MAJOR, offsetof(rlx_speculator_iface, propose) + sizeof sp->propose);
    if (!sp->open || !sp->close || !sp->reset || !sp->propose)
        return rlx_error(RLX_E_ABI, "%s: speculator table lacks a required function (open, close, reset, propose)",
                         what);
    return RLX_OK;
}

/* Re-raises the plugin's failure with the speculator's name in front. */
static rlx_status named_failure(const char *name, int rc, const char *doing) {
    const char *detail = rlx_last_error();
    return rlx_error(rc < 0 ? rc : RLX_E_PLUGIN, "speculator '%s': %s%s%s", name, doing, *detail ? ": " : "", detail);
}

rlx_status rlx_speculator_create(const rlx_plugin_handle *plugin, const rlx_spec_target *target, rlx_speculator **out) {
    if (!plugin || !target || !out)
        return rlx_error(RLX_E_INVALID, "rlx_speculator_create: NULL argument");
    *out = NULL;
    const rlx_plugin *d = rlx_plugin_desc(plugin);
    if (d->kind != RLX_PLUGIN_SPECULATOR)
        return rlx_error(RLX_E_INVALID, "plugin '%s' is a %s, not a speculator", d->name,
                         rlx_plugin_kind_name(d->kind));
    if (!d->iface)
        return rlx_error(RLX_E_ABI, "speculator '%s' has no function table", d->name);
    rlx_status rc = rlx__speculator_check_iface(rlx_plugin_path(plugin), d->iface);
    if (rc != RLX_OK)
        return rc;
    if (target->size < sizeof(rlx_spec_target) || target->vocab <= 0 || target->kv_capacity == 0)
        return rlx_error(RLX_E_INVALID, "speculator '%s': the target needs a size, a vocabulary and a capacity",
                         d->name);
    rlx_speculator *s = rlx__calloc(1, sizeof *s);
    if (!s)
        return rlx_error(RLX_E_NOMEM, "speculator '%s': out of memory", d->name);
    s->iface = d->iface;
    s->name = d->name;
    s->vocab = target->vocab;
    rlx_error_clear();
    int orc = s->iface->open(rlx_host_table(), target, &s->self);
    if (orc < 0) {
        free(s);
        return named_failure(d->name, orc, "cannot open");
    }
    *out = s;
    return RLX_OK;
}

void rlx_speculator_destroy(rlx_speculator *s) {
    if (!s)
        return;
    s->iface->close(s->self);
    free(s);
}

const char *rlx_speculator_name(const rlx_speculator *s) { return s->name; }
uint32_t rlx_speculator_flags(const rlx_speculator *s) { return s->iface->flags; }

rlx_status rlx_speculator_reset(rlx_speculator *s) {
    if (!s)
        return rlx_error(RLX_E_INVALID, "rlx_speculator_reset: speculator is NULL");
    rlx_error_clear();
    int rc = s->iface->reset(s->self);
    return rc < 0 ? named_failure(s->name, rc, "reset failed") : RLX_OK;
}

rlx_status rlx_speculator_propose(rlx_speculator *s, const rlx_spec_update *update, uint32_t k,
                                  const rlx_sampler_params *sampling, int32_t *tokens, float *probs,
                                  uint32_t *n_proposed) {
    if (!s || !update || !sampling || !tokens || !probs || !n_proposed)
        return rlx_error(RLX_E_INVALID, "rlx_speculator_propose: NULL argument");
    *n_proposed = 0;
    if ((update->n_tokens && !update->tokens) || update->n_accepted > update->n_tokens)
        return rlx_error(RLX_E_INVALID, "speculator '%s': an update of %u tokens cannot accept %u", s->name,
                         update->n_tokens, update->n_accepted);
    uint32_t n = 0;
    rlx_error_clear();
    int rc = s->iface->propose(s->self, update, k, sampling, tokens, probs, &n);
    if (rc < 0)
        return named_failure(s->name, rc, "propose failed");
    if (n > k)
        return rlx_error(RLX_E_PLUGIN, "speculator '%s' proposed %u tokens when asked for at most %u", s->name, n, k);
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= s->vocab)
            return rlx_error(RLX_E_PLUGIN,
                             "speculator '%s' proposed token id %d (draft %u) outside the vocabulary "
                             "[0, %lld)",
                             s->name, tokens[i], i, (long long)s->vocab);
        const float *row = probs + (size_t)i * (size_t)s->vocab;
        for (int64_t j = 0; j < s->vocab; j++)
            if (!isfinite(row[j]) || row[j] < 0)
                return rlx_error(RLX_E_PLUGIN,
                                 "speculator '%s': probability of token %lld in draft %u is %g, not a "
                                 "finite non-negative number",
                                 s->name, (long long)j, i, (double)row[j]);
        if (!(row[tokens[i]] > 0))
            return rlx_error(RLX_E_PLUGIN,
                             "speculator '%s' proposed token %d (draft %u) with probability 0 in its own "
                             "row",
                             s->name, tokens[i], i);
    }
    *n_proposed = n;
    return RLX_OK;
}

double rlx_spec_acceptance_rate(const rlx_spec_stats *st) {
    return st->proposed ? (double)st->accepted / (double)st->proposed : 0;
}

double rlx_spec_mean_accepted(const rlx_spec_stats *st) {
    return st->rounds ? (double)st->accepted / (double)st->rounds : 0;
}

double rlx_spec_tokens_per_pass(const rlx_spec_stats *st) {
    /* the first token comes from the prompt's pass, which target_passes does not count */
    return st->target_passes && st->gen.n_generated ? (double)(st->gen.n_generated - 1) / (double)st->target_passes : 0;
}

// ---- the decoding loop ----

/* The state of one rlx_spec_generate call. `pending` is the update for the next propose():
 * the tokens the accepted context gained, and the target's hidden rows before them. */
typedef struct spec_run {
    const rlx_lm *lm;
    rlx_speculator *spec;
    rlx_sampler *sampler;
    rlx_token_fn fn;
    void *ctx;
    uint32_t max_new;
    rlx_spec_stats st;
    int done;
    int32_t *pending; /* [max(n_prompt + 1, k + 1)] */
    uint32_t n_pending, n_accepted;
    float *hidden; /* [max(n_prompt, k + 1), hidden_size] when the speculator needs them */
    uint32_t n_hidden;
    int32_t *verify;     /* [k + 1]: the last token, then the drafts */
    float *q;            /* [k, vocab] the drafts' rows */
    float *p, *residual; /* [vocab] */
} spec_run;

/* Reports one generated token, drawn from the target's logits row `row`, and adds it to the
 * sampler's history; sets done on EOS, on max_new or when fn asks to stop. */
static void emit(spec_run *r, int32_t token, const float *row) {
    r->st.gen.n_generated++;
    /* cannot fail: the token was sampled, or is a draft rlx_speculator_propose checked */
    (void)rlx_sampler_accept(r->sampler, token);
    int stop = r->fn ? r->fn(r->ctx, token, row) : 0;
    if (rlx_lm_is_eos(r->lm, token)) {
        r->st.gen.stopped_on_eos = 1;
        r->st.gen.stop = RLX_GEN_STOP_EOS;
    } else if (stop) {
        r->st.gen.stop = RLX_GEN_STOP_CALLBACK;
    } else if (r->st.gen.n_generated == r->max_new) {
        r->st.gen.stop = RLX_GEN_STOP_MAX_NEW;
    }
    r->done = r->st.gen.stop != RLX_GEN_STOP_NONE;
}

/* Keeps rows [0, n) of the target's hidden states of its last forward for the next update
 * (lm->hidden is only valid until the next call). */
static void keep_hidden(spec_run *r, uint32_t n) {
    if (!r->hidden)
        return;
    size_t row = (size_t)r->lm->hidden_size;
    memcpy(r->hidden, r->lm->hidden(r->lm->self), (size_t)n * row * sizeof *r->hidden);
    r->n_hidden = n;
}

static rlx_status timed_forward(spec_run *r, const int32_t *ids, uint32_t n, int all_rows, const float **out) {
    double t0 = rlx__now_seconds();
    rlx_status rc = r->lm->forward(r->lm->self, ids, n, all_rows, out);
    r->st.verify_seconds += rlx__now_seconds() - t0;
    r->st.target_passes++;
    return rc;
}

/* Decides draft i against the target's row: 1 keeps it; 0 rejects it with the replacement in
 * *token. */
static int accept_draft(spec_run *r, const float *row, int32_t draft, const float *q, int32_t *token) {
    if (rlx_sampler_is_greedy(r->sampler)) {
        *token = rlx_sampler_sample(r->sampler, row); /* the argmax */
        return *token == draft;
    }
    int64_t vocab = r->lm->vocab;
    rlx_sampler_probs(r->sampler, row, r->p);
    /* q rows are checked to be non-negative with mass on the draft, not to sum to exactly 1 */
    double q_sum = 0;
    for (int64_t j = 0; j < vocab; j++)
        q_sum += q[j];
    if (rlx_sampler_uniform(r->sampler) * (double)q[draft] < (double)r->p[draft] * q_sum)
        return 1;
    double mass = 0;
    for (int64_t j = 0; j < vocab; j++) {
        double d = (double)r->p[j] - (double)q[j] / q_sum;
        r->residual[j] = d > 0 ? (float)d : 0.0f;
        mass += r->residual[j];
    }
    /* a rejection implies p(draft) < q(draft), so p - q has positive mass elsewhere; only
     * rounding of p == q can empty it, and then p itself is the distribution to draw from */
    *token = rlx_sampler_draw(r->sampler, mass > 0 ? r->residual : r->p);
    return 0;
}

/* One round after `token` was emitted: draft up to k, verify, emit, roll back. */
static rlx_status spec_round(spec_run *r, int32_t *token, uint32_t k) {
    const rlx_lm *lm = r->lm;
    int64_t vocab = lm->vocab;
    uint32_t length = lm->length(lm->self), room = lm->capacity(lm->self) - length;
    if (room == 0) { /* the emitted token has no position left to be fed at */
        r->st.gen.stop = RLX_GEN_STOP_CONTEXT;
        r->done = 1;
        return RLX_OK;
    }
    uint32_t remaining = r->max_new - r->st.gen.n_generated;
    /* the verification writes 1 + k positions; drafts past max_new could never be emitted */
    uint32_t want = k;
    if (room > 0 && want > room - 1)
        want = room - 1;
    if (want > remaining - 1)
        want = remaining - 1;
    uint32_t n = 0;
    rlx_status rc = RLX_OK;
    int ask = want > 0 && room > 0;
    if (ask) {
        rlx_spec_update u = {.size = sizeof u,
                             .tokens = r->pending,
                             .n_tokens = r->n_pending,
                             .n_accepted = r->n_accepted,
                             .hidden = r->hidden,
                             .n_hidden = r->n_hidden};
        rlx_sampler_params sp = rlx_sampler_params_of(r->sampler);
        sp.greedy = rlx_sampler_is_greedy(r->sampler); /* temperature 0 reaches the plugin as greedy */
        double t0 = rlx__now_seconds();
        rc = rlx_speculator_propose(r->spec, &u, want, &sp, r->verify + 1, r->q, &n);
        r->st.draft_seconds += rlx__now_seconds() - t0;
        if (rc != RLX_OK)
            return rc;
        /* the speculator now holds this context; what it gains from here on is the next update */
        r->n_pending = r->n_accepted = r->n_hidden = 0;
    }
    const float *rows;
    if (n == 0) {
        /* a plain decoding step; a speculator that drafted nothing still learns the token.
         * One that was not asked never will be: room and remaining only shrink. */
        if ((rc = timed_forward(r, token, 1, 0, &rows)) != RLX_OK)
            return rc;
        if ((*token = rlx_sampler_sample(r->sampler, rows)) < 0)
            return RLX_E_INVALID; /* a grammar that allows nothing here: its error is set */
        if (ask) {
            keep_hidden(r, 1);
            r->pending[r->n_pending++] = *token;
        }
        emit(r, *token, rows);
        return RLX_OK;
    }
    r->verify[0] = *token;
    if ((rc = timed_forward(r, r->verify, n + 1, 1, &rows)) != RLX_OK)
        return rc;
    r->st.rounds++;
    r->st.proposed += n;
    uint32_t kept = 0;
    int32_t next = -1;
    while (kept < n && !r->done) {
        int32_t draft = r->verify[1 + kept];
        const float *row = rows + (size_t)kept * (size_t)vocab;
        if (!accept_draft(r, row, draft, r->q + (size_t)kept * (size_t)vocab, &next))
            break;
        kept++;
        emit(r, draft, row);
    }
    r->st.accepted += kept;
    /* rows[kept] predicts the token after the kept drafts: the correction was drawn above,
     * the bonus token (every draft kept) is drawn here */
    if (!r->done && kept == n)
        next = rlx_sampler_sample(r->sampler, rows + (size_t)n * (size_t)vocab);
    if (next < 0 && !r->done)
        return rlx_error(RLX_E_INVALID, "speculative decoding: %s", rlx_last_error());
    int emitted_next = !r->done;
    if (emitted_next) {
        *token = next;
        emit(r, next, rows + (size_t)kept * (size_t)vocab);
    }
    /* the lm keeps the last token and every emitted draft but the newest emitted token, as
     * rlx_generate leaves it; rejected and unreached drafts are forgotten */
    uint32_t keep = length + 1 + (emitted_next ? kept : kept - 1);
    if (keep < length + 1 + n && (rc = lm->truncate(lm->self, keep)) != RLX_OK)
        return rc;
    keep_hidden(r, kept + 1);
    memcpy(r->pending, r->verify + 1, kept * sizeof *r->pending);
    r->n_pending = kept;
    r->n_accepted = kept;
    if (emitted_next)
        r->pending[r->n_pending++] = next;
    return RLX_OK;
}

rlx_status rlx_spec_generate(const rlx_lm *lm, rlx_speculator *spec, uint32_t k, rlx_sampler *sampler,
                             const int32_t *prompt, uint32_t n_prompt, uint32_t max_new, rlx_token_fn fn, void *ctx,
                             rlx_spec_stats *stats) {
    if (!lm || !spec || !sampler || !prompt || n_prompt == 0)
        return rlx_error(RLX_E_INVALID, "rlx_spec_generate: NULL argument or empty prompt");
    if (k == 0 || k > RLX_SPEC_MAX_DRAFT)
        return rlx_error(RLX_E_RANGE, "speculator '%s': draft tokens must be from 1 to %d, not %u", spec->name,
                         RLX_SPEC_MAX_DRAFT, k);
    if (lm->vocab != spec->vocab)
        return rlx_error(RLX_E_INVALID, "speculator '%s' was opened for a vocabulary of %lld, the model has %lld",
                         spec->name, (long long)spec->vocab, (long long)lm->vocab);
    int needs_hidden = (rlx_speculator_flags(spec) & RLX_SPEC_NEEDS_HIDDEN) != 0;
    if (needs_hidden && (!lm->hidden || lm->hidden_size <= 0))
        return rlx_error(RLX_E_UNSUPPORTED,
                         "speculator '%s' needs the target's hidden states, which this model "
                         "runner does not provide",
                         spec->name);
    spec_run r = {.lm = lm, .spec = spec, .sampler = sampler, .fn = fn, .ctx = ctx, .max_new = max_new};
    r.st.gen.n_prompt = n_prompt;
    size_t vocab = (size_t)lm->vocab, rows = n_prompt > k + 1 ? n_prompt : k + 1;
    r.pending = rlx__malloc((rows + 1) * sizeof *r.pending);
    r.verify = rlx__malloc((k + 1) * sizeof *r.verify);
    r.q = rlx__malloc(k * vocab * sizeof *r.q);
    r.p = rlx__malloc(vocab * sizeof *r.p);
    r.residual = rlx__malloc(vocab * sizeof *r.residual);
    if (needs_hidden)
        r.hidden = rlx__malloc(rows * (size_t)lm->hidden_size * sizeof *r.hidden);
    rlx_status rc = RLX_OK;
    if (!r.pending || !r.verify || !r.q || !r.p || !r.residual || (needs_hidden && !r.hidden)) {
        rc = rlx_error(RLX_E_NOMEM, "speculative decoding: out of memory for %u draft rows", k);
        goto done;
    }
    if ((rc = rlx_speculator_reset(spec)) != RLX_OK)
        goto done;
    const float *logits;
    double t0 = rlx__now_seconds();
    rc = lm->forward(lm->self, prompt, n_prompt, 0, &logits);
    double t1 = rlx__now_seconds();
    r.st.gen.prompt_seconds = t1 - t0;
    if (rc == RLX_OK) /* after the forward, which names a bad id better */
        rc = rlx__sampler_accept_all(sampler, prompt, n_prompt);
    if (rc == RLX_OK && max_new == 0)
        r.st.gen.stop = RLX_GEN_STOP_MAX_NEW;
    if (rc != RLX_OK || max_new == 0)
        goto done;
    keep_hidden(&r, n_prompt);
    int32_t token = rlx_sampler_sample(sampler, logits);
    if (token < 0) { /* a grammar that allows nothing here: its error is set */
        rc = RLX_E_INVALID;
        goto done;
    }
    memcpy(r.pending, prompt, n_prompt * sizeof *r.pending);
    r.pending[n_prompt] = token;
    r.n_pending = n_prompt + 1;
    emit(&r, token, logits);
    while (rc == RLX_OK && !r.done)
        rc = spec_round(&r, &token, k);
    r.st.gen.generate_seconds = rlx__now_seconds() - t1;
done:
    if (stats)
        *stats = r.st;
    free(r.pending);
    free(r.verify);
    free(r.q);
    free(r.p);
    free(r.residual);
    free(r.hidden);
    return rc;
}
