/* Token sampling: greedy, or temperature, then top-k, then top-p (the order Hugging Face applies
 * its logits warpers), drawn with a seeded xoshiro256** generator so a seed reproduces a run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/gen.h"

typedef struct candidate {
    float logit;
    int32_t id;
} candidate;

struct rlx_sampler {
    rlx_sampler_params p;
    int64_t vocab;
    uint64_t state[4];
    candidate *cand; /* [vocab] */
};

rlx_sampler_params rlx_sampler_params_default(void) {
    return (rlx_sampler_params){.greedy = 0, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
}

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

rlx_status rlx_sampler_create(const rlx_sampler_params *p, int64_t vocab, rlx_sampler **out) {
    if (!p || !out || vocab <= 0)
        return rlx_error(RLX_E_INVALID, "rlx_sampler_create: NULL argument or empty vocabulary");
    *out = NULL;
    if (!p->greedy) {
        if (!(p->temperature > 0) || !isfinite(p->temperature))
            return rlx_error(RLX_E_INVALID, "temperature must be > 0 (got %g); use greedy for argmax",
                             (double)p->temperature);
        if (p->top_k < 0)
            return rlx_error(RLX_E_INVALID, "top-k must be >= 0 (got %d)", p->top_k);
        if (!(p->top_p > 0 && p->top_p <= 1))
            return rlx_error(RLX_E_INVALID, "top-p must be in (0, 1] (got %g)", (double)p->top_p);
    }
    rlx_sampler *s = calloc(1, sizeof *s);
    if (!s || !(s->cand = malloc((size_t)vocab * sizeof *s->cand))) {
        free(s);
        return rlx_error(RLX_E_NOMEM, "sampler: out of memory");
    }
    s->p = *p;
    s->vocab = vocab;
    uint64_t seed = p->seed;
    for (int i = 0; i < 4; i++)
        s->state[i] = splitmix64(&seed);
    *out = s;
    return RLX_OK;
}

void rlx_sampler_destroy(rlx_sampler *s) {
    if (!s)
        return;
    free(s->cand);
    free(s);
}

static int32_t argmax(const float *logits, int64_t vocab) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
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
 * (written over logit as probability); returns n. */
static int64_t distribution(rlx_sampler *s, const float *logits) {
    int64_t n = s->vocab;
    for (int64_t i = 0; i < n; i++)
        s->cand[i] = (candidate){logits[i] / s->p.temperature, (int32_t)i};
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top(s->cand, n, s->p.top_k);
        n = s->p.top_k;
    }
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_logit_desc);
    double max = s->cand[0].logit, sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += exp((double)s->cand[i].logit - max);
    double cum = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; i++) {
        double prob = exp((double)s->cand[i].logit - max) / sum;
        s->cand[i].logit = (float)prob;
        cum += prob;
        /* top-p keeps the smallest prefix whose mass reaches top_p (at least one token) */
        if (s->p.top_p < 1 && cum >= s->p.top_p && keep == n)
            keep = i + 1;
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

int32_t rlx_sampler_sample(rlx_sampler *s, const float *logits) {
    if (s->p.greedy)
        return argmax(logits, s->vocab);
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
    if (s->p.greedy) {
        probs[argmax(logits, s->vocab)] = 1.0f;
        return;
    }
    int64_t n = distribution(s, logits);
    for (int64_t i = 0; i < n; i++)
        probs[s->cand[i].id] = s->cand[i].logit;
}

rlx_sampler_params rlx_sampler_params_of(const rlx_sampler *s) { return s->p; }

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
