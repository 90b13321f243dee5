/* A check's values: node buffers (64-byte aligned, freed with kit_node_free) and the kit's own
 * dtype conversions, kept apart from the checks and the fixture reader that both use them, and
 * from the plugin-side helpers of rlx, so the kit stays independent of what it checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kit.h"

void *kit_alloc(size_t bytes) {
    void *p = NULL;
    bytes = (bytes + 63) / 64 * 64;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return NULL;
    memset(p, 0, bytes ? bytes : 64);
    return p;
}

uint16_t kit_f32_to_bf16(float f) { /* round to nearest even; inputs are finite */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

uint16_t kit_f32_to_f16(float f) { /* inputs are small normal numbers or zero */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint32_t sign = (bits >> 16) & 0x8000, mant = bits & 0x7fffff;
    int32_t exp = (int32_t)((bits >> 23) & 0xff) - 127 + 15;
    if (exp <= 0)
        return (uint16_t)sign;
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
    if ((mant & 0x1fff) > 0x1000 || ((mant & 0x1fff) == 0x1000 && (half & 1)))
        half++;
    return (uint16_t)half;
}

float kit_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float kit_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float kit_load(const void *data, uint32_t dtype, size_t i) {
    if (dtype == RLX_DTYPE_BF16)
        return kit_bf16_to_f32(((const uint16_t *)data)[i]);
    if (dtype == RLX_DTYPE_F16)
        return kit_f16_to_f32(((const uint16_t *)data)[i]);
    return ((const float *)data)[i];
}

void kit_node_free(kit_node *n) {
    if (n->in)
        for (uint32_t i = 0; i < n->n_inputs; i++)
            free(n->in[i].data);
    free(n->in);
    free(n->is_weight);
    free(n->out.data);
    free(n->want);
    free(n->want_cache[0]);
    free(n->want_cache[1]);
    for (uint32_t k = 0; n->calls && k < n->n_calls * n->n_inputs; k++)
        free(n->calls[k].data);
    free(n->calls);
    free(n->call_status);
    memset(n, 0, sizeof *n);
}
