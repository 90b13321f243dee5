/* Reader of the NumPy expectation files written by gen_expectations.py. One file is one node:
 * its inputs (as NumPy drew and stored them) and the output NumPy computed in float64 from
 * those stored values, independently of the core's C reference kernels. Layout, little-endian:
 *   "RLXCASE\0" u32 version(1) u32 op u32 n_inputs u32 name_len, name bytes
 *   f32 eps, rope_theta, scale; u32 head_dim, n_heads, n_kv_heads, window, n_experts, top_k,
 *   norm_topk; f64 max_pos
 *   n_inputs tensors, then the expected output tensor (F32), each:
 *     u32 dtype u32 n_dims u32 flags (1 = weight) u32 0, i64 shape[4], numel * size bytes
 *   u32 n_states, then for each: u32 input index, the expected contents of that input after the
 *   call, in its dtype (ATTENTION's caches, F32 or F16: inputs 4 and 5, in that order). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit.h"

typedef struct cursor {
    const uint8_t *p, *end;
    int bad;
} cursor;

static void take(cursor *c, void *dst, size_t n) {
    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, c->p, n);
    c->p += n;
}

static uint32_t u32(cursor *c) {
    uint32_t v;
    take(c, &v, 4);
    return v;
}

/* A tensor record; data copied into a new 64-byte aligned buffer when with_data. */
static int tensor(cursor *c, rlx_tensor *t, uint32_t *flags, int with_data) {
    t->dtype = u32(c);
    t->n_dims = u32(c);
    *flags = u32(c);
    (void)u32(c);
    take(c, t->shape, sizeof t->shape);
    if (c->bad || t->dtype >= RLX_DTYPE_COUNT || t->n_dims < 1 || t->n_dims > RLX_MAX_DIMS)
        return -1;
    for (int d = 0; d < RLX_MAX_DIMS; d++)
        if (t->shape[d] < 1 || t->shape[d] > (1ll << 32))
            return -1;
    size_t bytes = rlx_iface_tensor_bytes(t);
    if ((size_t)(c->end - c->p) < bytes)
        return -1;
    if (with_data) {
        if (!(t->data = kit_alloc(bytes)))
            return -1;
        memcpy(t->data, c->p, bytes);
    }
    c->p += bytes;
    return 0;
}

int kit_fixture_read(const char *path, kit_node *n, char *name, size_t name_len, int with_data, char *why,
                     size_t why_len) {
    memset(n, 0, sizeof *n);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            uint8_t *grown = realloc(buf, cap = cap ? cap * 2 : 1 << 16);
            if (!grown) {
                free(buf);
                fclose(f);
                snprintf(why, why_len, "%s: out of memory", path);
                return -1;
            }
            buf = grown;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    fclose(f);
    cursor c = {buf, buf + len, 0};
    char magic[8];
    take(&c, magic, 8);
    uint32_t version = u32(&c), op = u32(&c), n_inputs = u32(&c), nlen = u32(&c);
    if (c.bad || memcmp(magic, "RLXCASE", 8) != 0 || version != 1 || op < 1 || op >= RLX_OP_COUNT || n_inputs < 1 ||
        n_inputs > 1024 || nlen > 1000 || (size_t)(c.end - c.p) < nlen) {
        free(buf);
        snprintf(why, why_len, "%s: not an rlx conformance fixture (version 1)", path);
        return -1;
    }
    if (name)
        snprintf(name, name_len, "%.*s", (int)nlen, (const char *)c.p);
    c.p += nlen;
    n->op = op;
    n->n_inputs = n_inputs;
    n->in = calloc(n_inputs, sizeof *n->in);
    n->is_weight = calloc(n_inputs, 1);
    if (!n->in || !n->is_weight)
        goto bad;
    take(&c, &n->p.eps, 4);
    take(&c, &n->p.rope_theta, 4);
    take(&c, &n->p.scale, 4);
    n->p.head_dim = u32(&c);
    n->p.n_heads = u32(&c);
    n->p.n_kv_heads = u32(&c);
    n->p.window = u32(&c);
    n->p.n_experts = u32(&c);
    n->p.top_k = u32(&c);
    n->p.norm_topk = u32(&c);
    take(&c, &n->max_pos, 8);
    uint32_t flags;
    for (uint32_t i = 0; i < n_inputs; i++) {
        if (tensor(&c, &n->in[i], &flags, with_data) < 0)
            goto bad;
        n->is_weight[i] = flags & 1;
    }
    if (tensor(&c, &n->out, &flags, with_data) < 0 || n->out.dtype != RLX_DTYPE_F32)
        goto bad;
    n->want = n->out.data; /* the record's data is the expectation; the output buffer comes later */
    n->out.data = NULL;
    uint32_t n_states = u32(&c);
    if (c.bad || n_states > 2)
        goto bad;
    for (uint32_t s = 0; s < n_states; s++) {
        uint32_t idx = u32(&c);
        if (c.bad || idx != 4 + s || idx >= n_inputs)
            goto bad;
        size_t bytes = rlx_iface_tensor_bytes(&n->in[idx]);
        if ((size_t)(c.end - c.p) < bytes)
            goto bad;
        if (with_data) {
            if (!(n->want_cache[s] = kit_alloc(bytes)))
                goto bad;
            memcpy(n->want_cache[s], c.p, bytes);
        }
        c.p += bytes;
    }
    if (c.p != c.end)
        goto bad;
    free(buf);
    return 0;
bad:
    free(buf);
    kit_node_free(n);
    snprintf(why, why_len, "%s: truncated or malformed fixture", path);
    return -1;
}
