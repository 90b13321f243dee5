/* Layer ranges of pipeline stages: the even split, the coverage check and "A-B" parsing. */
#include <errno.h>
#include <stdlib.h>

#include "rlx/dist.h"

rlx_status rlx_dist_split_even(uint32_t n_layers, uint32_t n_stages, rlx_layer_range *out) {
    if (!out || n_stages == 0)
        return rlx_error(RLX_E_INVALID, "layer split: no stages");
    if (n_stages > n_layers)
        return rlx_error(RLX_E_RANGE, "cannot split %u layers over %u stages: every stage needs a layer", n_layers,
                         n_stages);
    uint32_t base = n_layers / n_stages, extra = n_layers % n_stages, start = 0;
    for (uint32_t i = 0; i < n_stages; i++) {
        uint32_t len = base + (i < extra);
        out[i] = (rlx_layer_range){start, start + len};
        start += len;
    }
    return RLX_OK;
}

/* The weights a token reads in layer l: attention, and the MLP or the experts it is routed to
 * (with the router). */
static uint64_t layer_weights(const rlx_model_config *c, uint32_t l) {
    const uint64_t h = (uint64_t)c->hidden_size, q = (uint64_t)(c->num_attention_heads * c->head_dim),
                   kv = (uint64_t)(c->num_key_value_heads * c->head_dim);
    const uint64_t attention = 2 * h * q + 2 * h * kv;
    if (rlx_model_config_layer_is_moe(c, l))
        return attention + (uint64_t)c->num_experts_per_tok * 3 * h * (uint64_t)c->moe_intermediate_size +
               h * (uint64_t)c->num_experts;
    return attention + 3 * h * (uint64_t)c->intermediate_size;
}

rlx_status rlx_dist_split_balanced(const rlx_model_config *cfg, uint32_t n_stages, rlx_layer_range *out) {
    if (!cfg || !out || n_stages == 0)
        return rlx_error(RLX_E_INVALID, "layer split: no configuration or no stages");
    const uint32_t n =
        cfg->num_hidden_layers > 0 && cfg->num_hidden_layers <= RLX_MAX_LAYERS ? (uint32_t)cfg->num_hidden_layers : 0;
    rlx_status rc = rlx_dist_split_even(n, n_stages, out);
    if (rc != RLX_OK || n_stages == 1 || cfg->hidden_size <= 0)
        return rc; /* without sizes every layer weighs the same */
    /* prefix[l]: the weights of layers [0, l); the last stage reads the LM head too */
    uint64_t prefix[RLX_MAX_LAYERS + 1] = {0};
    for (uint32_t l = 0; l < n; l++)
        prefix[l + 1] = prefix[l] + layer_weights(cfg, l);
    const uint64_t head = (uint64_t)cfg->vocab_size * (uint64_t)cfg->hidden_size;
    /* best[k][j]: the smallest heaviest stage when stages k.. (the last one with the head) run
     * layers [j, n); UINT64_MAX when they cannot (fewer layers than stages) */
    uint64_t(*best)[RLX_MAX_LAYERS + 1] = calloc(n_stages + 1, sizeof *best);
    if (!best)
        return rlx_error(RLX_E_NOMEM, "layer split: out of memory");
    for (uint32_t j = 0; j <= n; j++)
        best[n_stages][j] = j == n ? 0 : UINT64_MAX;
    for (uint32_t k = n_stages; k-- > 0;)
        for (uint32_t j = 0; j <= n; j++) {
            uint64_t b = UINT64_MAX;
            for (uint32_t e = j + 1; e <= n; e++) {
                if (best[k + 1][e] == UINT64_MAX)
                    continue;
                const uint64_t w = prefix[e] - prefix[j] + (k + 1 == n_stages ? head : 0);
                const uint64_t m = w > best[k + 1][e] ? w : best[k + 1][e];
                b = m < b ? m : b;
            }
            best[k][j] = b;
        }
    const uint64_t bound = best[0][0];
    /* of the splits within that bound, the one nearest to the even split, front to back (the
     * earlier stage takes the extra layer, as the even split gives it) */
    uint32_t start = 0;
    for (uint32_t k = 0; k < n_stages; k++) {
        const uint32_t left = n_stages - k, share = (n - start + left - 1) / left;
        uint32_t pick = 0, dist = UINT32_MAX;
        for (uint32_t e = start + 1; e <= n; e++) {
            const uint64_t w = prefix[e] - prefix[start] + (k + 1 == n_stages ? head : 0);
            if (w > bound || best[k + 1][e] > bound)
                continue;
            const uint32_t len = e - start, d = len > share ? len - share : share - len;
            if (d < dist || (d == dist && e > pick))
                pick = e, dist = d;
        }
        out[k] = (rlx_layer_range){start, pick};
        start = pick;
    }
    free(best);
    return RLX_OK;
}

rlx_status rlx_dist_check_ranges(uint32_t n_layers, const rlx_layer_range *r, uint32_t n_stages) {
    if (!r || n_stages == 0)
        return rlx_error(RLX_E_INVALID, "layer ranges: no stages");
    uint32_t expect = 0;
    for (uint32_t i = 0; i < n_stages; i++) {
        if (r[i].end <= r[i].start)
            return rlx_error(RLX_E_RANGE, "stage %u: layer range %u-%u is empty", i, r[i].start, r[i].end - 1);
        if (r[i].start > expect)
            return rlx_error(RLX_E_RANGE, "stage %u: layers %u-%u are run by no stage (gap before layers %u-%u)", i,
                             expect, r[i].start - 1, r[i].start, r[i].end - 1);
        if (r[i].start < expect)
            return rlx_error(RLX_E_RANGE, "stage %u: layers %u-%u overlap the previous stage, which ends at layer %u",
                             i, r[i].start, r[i].end - 1, expect - 1);
        if (r[i].end > n_layers)
            return rlx_error(RLX_E_RANGE, "stage %u: layers %u-%u run past the model's %u layers (0-%u)", i, r[i].start,
                             r[i].end - 1, n_layers, n_layers - 1);
        expect = r[i].end;
    }
    if (expect != n_layers)
        return rlx_error(RLX_E_RANGE, "layers %u-%u are run by no stage (the last stage ends at layer %u)", expect,
                         n_layers - 1, expect - 1);
    return RLX_OK;
}

static int parse_u32(const char *s, char **end, uint32_t *out) {
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long v = strtoul(s, end, 10);
    if (errno || v >= RLX_MAX_LAYERS)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

rlx_status rlx_dist_parse_range(const char *text, rlx_layer_range *out) {
    if (!text || !out)
        return rlx_error(RLX_E_INVALID, "rlx_dist_parse_range: NULL argument");
    uint32_t a, b;
    char *end;
    if (parse_u32(text, &end, &a) < 0)
        goto bad;
    b = a;
    if (*end == '-' && parse_u32(end + 1, &end, &b) < 0)
        goto bad;
    if (*end)
        goto bad;
    if (b < a)
        return rlx_error(RLX_E_RANGE, "layer range '%s' ends before it starts", text);
    *out = (rlx_layer_range){a, b + 1};
    return RLX_OK;
bad:
    return rlx_error(RLX_E_INVALID, "'%s' is not a layer range like 0-13 (first-last, inclusive, below %d)", text,
                     RLX_MAX_LAYERS);
}
