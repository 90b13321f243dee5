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
