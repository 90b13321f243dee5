/* Token sampling: the penalties on the raw logits (Hugging Face's RepetitionPenaltyLogitsProcessor,
 * then OpenAI's presence and frequency penalties), then greedy, or temperature, top-k, top-p and
 * min-p (the order Hugging Face applies its logits warpers), drawn with a seeded xoshiro256**
 * generator so a seed reproduces a run.
 *
 * The penalties need the window of the context they look at: a ring of its last repeat_last_n
 * ids plus, per id, its count in the window and its place in the list of the ids present, so a
 * token entering or leaving the window costs O(1) and penalising costs O(distinct ids). The ring
 * grows with the tokens accepted, so a window wider than the context (repeat_last_n is the
 * caller's, up to 2^31 - 1) costs no more than the context does.
 *
 * Tiny temperatures: probabilities are exp((logit - max) / T) in double, so no T > 0 overflows
 * them. Below FLT_MIN (1.18e-38, the smallest normal float; 1 / T is no longer a float) the
 * sampler is greedy: there every gap between two float logits of magnitude >= 2^-90 (spaced at
 * least 2^-113, which is over 745 * FLT_MIN) gives the lower one exp(-gap / T) = 0 even in a
 * double, so the distribution is the argmax's anyway. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gen/gen_internal.h"
#include "rlx/grammar.h"
#include "util/alloc.h"

/* The ring's first size: a window of the default 64 needs no growing. */
#define RING_FIRST 64u

typedef struct candidate {
    float logit;
    int32_t id;
} candidate;

struct rlx_sampler {
    rlx_sampler_params p;
    int64_t vocab;
    uint64_t state[4];
    candidate *cand; /* [vocab] */
    /* The history, kept only when a penalty is on (`penalize`). */
    int penalize;
    int32_t *ring;                          /* [ring_cap] the window, oldest at ring_head once full; NULL for -1 */
    uint32_t ring_head, ring_len, ring_cap; /* ring_cap grows to repeat_last_n as tokens come */
    int32_t *count;                         /* [vocab] occurrences of each id in the window */
    int32_t *present;                       /* [vocab] the n_present distinct ids of the window, in no order */
    int32_t *slot;                          /* [vocab] index of an id in present, while its count is > 0 */
    int64_t n_present;
    /* logit biases: bias[vocab] (NULL without any) and the distinct biased ids, whose copy
     * p.logit_bias points at */
    float *bias;
    rlx_logit_bias *biased;
    /* constrained decoding (rlx_sampler_set_grammar): the matcher (borrowed), the ids that may
     * end the text, and a copy of the logits row with the grammar's refusals at -inf */
    rlx_grammar_matcher *grammar;
    int32_t *end_ids;
    uint32_t n_end;
    float *masked; /* [vocab] */
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t *s) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* uniform in [0, 1) with 53 random bits */
static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

static rlx_status check_params(const rlx_sampler_params *p) {
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return rlx_error(RLX_E_INVALID, "temperature must be a finite number >= 0 (0 = greedy), got %g",
                         (double)p->temperature);
    if (p->top_k < 0)
        return rlx_error(RLX_E_INVALID, "top-k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return rlx_error(RLX_E_INVALID, "top-p must be in (0, 1] (1 = off), got %g", (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return rlx_error(RLX_E_INVALID, "min-p must be in [0, 1] (0 = off), got %g", (double)p->min_p);
    if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty))
        return rlx_error(RLX_E_INVALID, "the repeat penalty must be a finite number > 0 (1 = off), got %g",
                         (double)p->repeat_penalty);
    if (p->repeat_last_n < -1)
        return rlx_error(RLX_E_INVALID,
                         "repeat-last-n must be >= -1 (-1 = the whole context, 0 = no penalties), "
                         "got %d",
                         p->repeat_last_n);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return rlx_error(RLX_E_INVALID, "the presence and frequency penalties must be finite, got %g and %g",
                         (double)p->presence_penalty, (double)p->frequency_penalty);
    return RLX_OK;
}

/* s->bias and s->biased from p's list, summing a token listed twice; s->p.logit_bias then
 * points at the sampler's own copy of the distinct ids. */
static rlx_status copy_biases(rlx_sampler *s, const rlx_sampler_params *p) {
    if (!p->logit_bias)
        return rlx_error(RLX_E_INVALID, "%u logit biases but a NULL list", p->n_logit_bias);
    unsigned char *listed = rlx__calloc((size_t)s->vocab, 1);
    if (!listed || !(s->bias = rlx__calloc((size_t)s->vocab, sizeof *s->bias)) ||
        !(s->biased = rlx__malloc((size_t)p->n_logit_bias * sizeof *s->biased))) {
        free(listed);
        return rlx_error(RLX_E_NOMEM, "sampler: out of memory for %u logit biases", p->n_logit_bias);
    }
    uint32_t n = 0;
    rlx_status rc = RLX_OK;
    for (uint32_t i = 0; i < p->n_logit_bias && rc == RLX_OK; i++) {
        const rlx_logit_bias b = p->logit_bias[i];
        if (b.token < 0 || b.token >= s->vocab)
            rc = rlx_error(RLX_E_INVALID, "logit bias on token %d, outside the vocabulary [0, %lld)", b.token,
                           (long long)s->vocab);
        else if (isnan(b.bias) || b.bias == INFINITY)
            rc = rlx_error(RLX_E_INVALID, "the logit bias of token %d is %g: a finite number or -inf", b.token,
                           (double)b.bias);
        else {
            if (!listed[b.token]) {
                listed[b.token] = 1;
                s->biased[n++] = (rlx_logit_bias){b.token, 0};
            }
            s->bias[b.token] += b.bias;
        }
    }
    free(listed);
    if (rc != RLX_OK)
        return rc;
    int64_t banned = 0;
    for (uint32_t k = 0; k < n; k++) {
        s->biased[k].bias = s->bias[s->biased[k].token];
        banned += s->biased[k].bias == -INFINITY;
    }
    if (banned == s->vocab)
        return rlx_error(RLX_E_INVALID, "the logit biases ban every token of the vocabulary");
    s->p.logit_bias = s->biased;
    s->p.n_logit_bias = n;
    return RLX_OK;
}

rlx_status rlx_sampler_create(const rlx_sampler_params *p, int64_t vocab, rlx_sampler **out) {
    if (!p || !out || vocab <= 0 || vocab > INT32_MAX)
        return rlx_error(RLX_E_INVALID, "rlx_sampler_create: NULL argument or a vocabulary not in [1, 2^31)");
    *out = NULL;
    if (p->size < RLX_SAMPLER_PARAMS_SIZE_1)
        return rlx_error(RLX_E_INVALID,
                         "rlx_sampler_params.size is %u, below its first version's %u bytes (start "
                         "from rlx_sampler_params_default)",
                         p->size, RLX_SAMPLER_PARAMS_SIZE_1);
    /* a caller built against an older header has a shorter struct: read only what it wrote */
    const rlx_sampler_params params = rlx_sampler_params_read(p);
    p = &params;
    rlx_status rc = check_params(p);
    if (rc != RLX_OK)
        return rc;
    rlx_sampler *s = rlx__calloc(1, sizeof *s);
    if (!s || !(s->cand = rlx__malloc((size_t)vocab * sizeof *s->cand)))
        goto nomem;
    s->p = *p;
    s->vocab = vocab;
    s->penalize =
        p->repeat_last_n != 0 && (p->repeat_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0);
    if (s->penalize) {
        s->count = rlx__calloc((size_t)vocab, sizeof *s->count);
        s->present = rlx__malloc((size_t)vocab * sizeof *s->present);
        s->slot = rlx__malloc((size_t)vocab * sizeof *s->slot);
        if (!s->count || !s->present || !s->slot)
            goto nomem;
    }
    if (p->n_logit_bias && (rc = copy_biases(s, p)) != RLX_OK) {
        rlx_sampler_destroy(s);
        return rc;
    }
    uint64_t seed = p->seed;
    for (int i = 0; i < 4; i++)
        s->state[i] = splitmix64(&seed);
    *out = s;
    return RLX_OK;
nomem:
    rlx_sampler_destroy(s);
    return rlx_error(RLX_E_NOMEM, "sampler: out of memory for a vocabulary of %lld", (long long)vocab);
}

void rlx_sampler_destroy(rlx_sampler *s) {
    if (!s)
        return;
    free(s->cand);
    free(s->ring);
    free(s->count);
    free(s->present);
    free(s->slot);
    free(s->bias);
    free(s->biased);
    free(s->end_ids);
    free(s->masked);
    free(s);
}

rlx_status rlx_sampler_set_grammar(rlx_sampler *s, rlx_grammar_matcher *m, const int32_t *end_ids, size_t n_end) {
    if (!s || (n_end && !end_ids) || n_end > UINT32_MAX)
        return rlx_error(RLX_E_INVALID, "rlx_sampler_set_grammar: NULL argument");
    int32_t *ends = n_end ? rlx__malloc(n_end * sizeof *ends) : NULL;
    if ((n_end && !ends) || (m && !s->masked && !(s->masked = rlx__malloc((size_t)s->vocab * sizeof *s->masked)))) {
        free(ends);
        return rlx_error(RLX_E_NOMEM, "sampler: out of memory for a grammar over %lld tokens", (long long)s->vocab);
    }
    if (n_end)
        memcpy(ends, end_ids, n_end * sizeof *ends);
    free(s->end_ids);
    s->end_ids = ends;
    s->n_end = (uint32_t)n_end;
    s->grammar = m;
    return RLX_OK;
}

// ---- history ----

static void window_add(rlx_sampler *s, int32_t id) {
    if (s->count[id]++ == 0) {
        s->slot[id] = (int32_t)s->n_present;
        s->present[s->n_present++] = id;
    }
}

static void window_remove(rlx_sampler *s, int32_t id) {
    if (--s->count[id] == 0) {
        int32_t last = s->present[--s->n_present];
        s->present[s->slot[id]] = last;
        s->slot[last] = s->slot[id];
    }
}

static int is_end(const rlx_sampler *s, int32_t token) {
    for (uint32_t i = 0; i < s->n_end; i++)
        if (s->end_ids[i] == token)
            return 1;
    return 0;
}

/* The token into the penalties' window. */
static rlx_status history_add(rlx_sampler *s, int32_t token) {
    if (token < 0 || token >= s->vocab)
        return rlx_error(RLX_E_INVALID, "sampler: token %d is outside the vocabulary [0, %lld)", token,
                         (long long)s->vocab);
    if (!s->penalize)
        return RLX_OK;
    if (s->p.repeat_last_n > 0) {
        const uint32_t window = (uint32_t)s->p.repeat_last_n;
        if (s->ring_len == s->ring_cap && s->ring_cap < window) {
            /* not full yet, so not wrapped: ring_head == ring_len and the ids are in order */
            uint32_t cap = s->ring_cap < RING_FIRST / 2 ? RING_FIRST : 2 * s->ring_cap;
            cap = cap < window ? cap : window;
            int32_t *grown = rlx__realloc(s->ring, (size_t)cap * sizeof *grown);
            if (!grown)
                return rlx_error(RLX_E_NOMEM, "sampler: out of memory for a window of %u tokens", cap);
            s->ring = grown;
            s->ring_cap = cap;
        }
        if (s->ring_len == window)
            window_remove(s, s->ring[s->ring_head]);
        else
            s->ring_len++;
        s->ring[s->ring_head] = token;
        s->ring_head = s->ring_head + 1 == window ? 0 : s->ring_head + 1;
    }
    window_add(s, token);
    return RLX_OK;
}

rlx_status rlx_sampler_accept(rlx_sampler *s, int32_t token) {
    rlx_status rc = RLX_OK;
    /* a generated token moves the grammar on (an end id ends the text, so it has nothing to pass) */
    if (token >= 0 && token < s->vocab && s->grammar && !is_end(s, token) &&
        (rc = rlx_grammar_matcher_accept(s->grammar, token)) != RLX_OK)
        return rc;
    return history_add(s, token);
}

/* The prompt is history for the penalties, never text for the grammar, which constrains only
 * what is generated. */
rlx_status rlx__sampler_accept_all(rlx_sampler *s, const int32_t *ids, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        rlx_status rc = history_add(s, ids[i]);
        if (rc != RLX_OK)
            return rc;
    }
    return RLX_OK;
}

void rlx_sampler_reset_history(rlx_sampler *s) {
    for (int64_t i = 0; i < s->n_present; i++)
        s->count[s->present[i]] = 0;
    s->n_present = 0;
    s->ring_head = s->ring_len = 0;
}

/* The logit of a token seen count > 0 times in the window. The repetition penalty first, as
 * llama.cpp orders them: HF's rule divides a positive logit and multiplies a negative one, so
 * a seen token always loses probability; then OpenAI's logit -= presence + frequency * count. */
static float penalized(const rlx_sampler_params *p, float logit, int32_t count) {
    if (p->repeat_penalty != 1)
        logit = logit > 0 ? logit / p->repeat_penalty : logit * p->repeat_penalty;
    return logit - p->presence_penalty - p->frequency_penalty * (float)count;
}

/* Token i's logit after its bias and its penalties (it was seen count[i] times). Extreme but
 * finite parameters (a repeat penalty of 1e-30, penalties of 1e38) could push a logit past
 * FLT_MAX: it stays at +-FLT_MAX, keeping its order, so no +-inf meets another in a
 * difference (NaN). Only a bias of -inf bans a token. */
static float adjusted(const rlx_sampler *s, int64_t i, float logit) {
    if (s->bias)
        logit += s->bias[i];
    if (logit == -INFINITY)
        return logit;
    if (s->penalize && s->count[i])
        logit = penalized(&s->p, logit, s->count[i]);
    return logit > FLT_MAX ? FLT_MAX : logit < -FLT_MAX ? -FLT_MAX : logit;
}

/* The argmax of the biased and penalised logits, the lowest id among equals (as torch.argmax). */
static int32_t argmax(const rlx_sampler *s, const float *logits) {
    int64_t best = 0;
    if (!s->bias && (!s->penalize || s->n_present == 0)) {
        for (int64_t i = 1; i < s->vocab; i++)
            if (logits[i] > logits[best])
                best = i;
        return (int32_t)best;
    }
    float best_logit = adjusted(s, 0, logits[0]);
    for (int64_t i = 1; i < s->vocab; i++) {
        const float l = adjusted(s, i, logits[i]);
        if (l > best_logit) {
            best_logit = l;
            best = i;
        }
    }
    return (int32_t)best;
}

static int by_logit_desc(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id; /* ties: lower id first, deterministic */
}

/* Moves the k largest candidates to the front (unordered): quickselect on logits. */
static void select_top(candidate *c, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        candidate pivot = c[(lo + hi) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (by_logit_desc(&c[i], &pivot) < 0)
                i++;
            while (by_logit_desc(&c[j], &pivot) > 0)
                j--;
            if (i <= j) {
                candidate t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* Fills s->cand[0..n) with the surviving candidates sorted by logit and their probabilities
 * (written over logit as probability); returns n. The candidates are sorted by their unscaled
 * logits (temperature keeps the order), and scaled in double after the largest is subtracted:
 * (logit - max) / T is <= 0 and finite for every T the sampler takes, and exp of it in [0, 1]. */
static int64_t distribution(rlx_sampler *s, const float *logits) {
    int64_t n = s->vocab;
    for (int64_t i = 0; i < n; i++)
        s->cand[i] = (candidate){logits[i], (int32_t)i};
    /* cand[id] is still token id's */
    if (s->penalize)
        for (int64_t i = 0; i < s->n_present; i++) {
            int32_t id = s->present[i];
            s->cand[id].logit = adjusted(s, id, logits[id]);
        }
    for (uint32_t i = 0; i < s->p.n_logit_bias; i++) {
        const int32_t id = s->biased[i].token;
        s->cand[id].logit = adjusted(s, id, logits[id]);
    }
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top(s->cand, n, s->p.top_k);
        n = s->p.top_k;
    }
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_logit_desc);
    const double max = s->cand[0].logit, temperature = s->p.temperature;
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += exp(((double)s->cand[i].logit - max) / temperature);
    double cum = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; i++) {
        double prob = exp(((double)s->cand[i].logit - max) / temperature) / sum;
        s->cand[i].logit = (float)prob;
        cum += prob;
        /* top-p keeps the smallest prefix whose mass reaches top_p (at least one token) */
        if (s->p.top_p < 1 && cum >= s->p.top_p && keep == n)
            keep = i + 1;
    }
    /* min-p compares with the top probability, which renormalising after top-p scales alike */
    if (s->p.min_p > 0) {
        double floor = (double)s->p.min_p * s->cand[0].logit;
        int64_t above = 1;
        while (above < keep && (double)s->cand[above].logit >= floor)
            above++;
        keep = above;
    }
    if (keep < n) {
        double kept = 0;
        for (int64_t i = 0; i < keep; i++)
            kept += s->cand[i].logit;
        for (int64_t i = 0; i < keep; i++)
            s->cand[i].logit = (float)(s->cand[i].logit / kept);
    }
    return keep;
}

/* The logits row with the grammar's refusals at -inf (a copy: the caller's row keeps the raw
 * logits its log-probabilities are reported from), or NULL when the grammar allows nothing. */
static const float *constrained(rlx_sampler *s, const float *logits) {
    memcpy(s->masked, logits, (size_t)s->vocab * sizeof *s->masked);
    return rlx_grammar_matcher_mask(s->grammar, s->masked, s->vocab, s->end_ids, s->n_end) > 0 ? s->masked : NULL;
}

int32_t rlx_sampler_sample(rlx_sampler *s, const float *logits) {
    if (rlx_sampler_is_greedy(s)) {
        /* the argmax of the masked row is the raw row's whenever the grammar allows that one, so
         * the mask over the whole vocabulary is needed only when it does not */
        int32_t best = argmax(s, logits);
        if (!s->grammar || rlx_grammar_matcher_allows(s->grammar, best, s->end_ids, s->n_end))
            return best;
        return (logits = constrained(s, logits)) ? argmax(s, logits) : -1;
    }
    if (s->grammar && !(logits = constrained(s, logits)))
        return -1;
    int64_t n = distribution(s, logits);
    double r = next_unit(s->state), cum = 0;
    for (int64_t i = 0; i < n; i++) {
        cum += s->cand[i].logit;
        if (r < cum)
            return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* rounding left r above the total */
}

void rlx_sampler_probs(rlx_sampler *s, const float *logits, float *probs) {
    memset(probs, 0, (size_t)s->vocab * sizeof *probs);
    if (s->grammar && !(logits = constrained(s, logits)))
        return; /* no mass: drawing from it fails with the grammar's error */
    if (rlx_sampler_is_greedy(s)) {
        probs[argmax(s, logits)] = 1.0f;
        return;
    }
    int64_t n = distribution(s, logits);
    for (int64_t i = 0; i < n; i++)
        probs[s->cand[i].id] = s->cand[i].logit;
}

rlx_sampler_params rlx_sampler_params_of(const rlx_sampler *s) { return s->p; }

/* below FLT_MIN the distribution is the argmax's (the comment at the top) */
int rlx_sampler_is_greedy(const rlx_sampler *s) { return s->p.greedy || s->p.temperature < FLT_MIN; }

double rlx_sampler_uniform(rlx_sampler *s) { return next_unit(s->state); }

int32_t rlx_sampler_draw(rlx_sampler *s, const float *probs) {
    double total = 0;
    for (int64_t i = 0; i < s->vocab; i++)
        total += probs[i];
    if (!(total > 0))
        return rlx_error(RLX_E_INVALID, "cannot draw from a probability row with no mass"), -1;
    double r = next_unit(s->state) * total, cum = 0;
    int64_t last = -1;
    for (int64_t i = 0; i < s->vocab; i++) {
        if (probs[i] <= 0)
            continue;
        cum += probs[i];
        last = i;
        if (r < cum)
            return (int32_t)i;
    }
    return (int32_t)last; /* rounding left r above the running total: the last token with mass */
}
