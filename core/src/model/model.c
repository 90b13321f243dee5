/* Qwen3 model directories and the block builder. The list of weights a block needs, with the
 * shapes its config implies, is computed in one place (block_needs) and serves the weight
 * filter, the pre-build check and the builder alike.
 *
 * An MTP block's decoder layer is built by the same code as the model's layers, from the tensors
 * under model.mtp_layers.N.mtp_block.; it is configured as a layer after the target's last
 * (DeepSeek-V3 numbers its MTP layers so): a dense MLP of intermediate_size and full attention. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "gguf.h"
#include "graph/graph_impl.h"
#include "model_internal.h"
#include "quantize.h"
#include "weights_internal.h"
#include "rlx/model.h"
#include "util/alloc.h"
#include "util/sized.h"

struct rlx_model {
    char *dir; /* the model directory, or the GGUF file (its first shard) */
    int gguf;
    rlx_model_config cfg;
    rlx_weights *weights;
    rlx_weights **added; /* rlx_model_add_weights files, searched after the model's own */
    size_t n_added;
    uint64_t weight_owner; /* what backends prepared of its weights is released with it */
    /* rlx_model_quantize replaced matrices by buffers of its own: not every weight is a page of
     * the mapped files any more, so none is offered as RLX_WEIGHT_FILE_BACKED (a backend dropping
     * such "pages" after repacking would zero what EMBED of a tied table reads later). */
    bool quantized;
};

rlx_status rlx_model_open(const char *model_dir, rlx_model **out) {
    if (!model_dir || !out)
        return rlx_error(RLX_E_INVALID, "rlx_model_open: NULL argument");
    *out = NULL;
    rlx_model *m = rlx__calloc(1, sizeof *m);
    if (!m || !(m->dir = rlx__strdup(model_dir))) {
        free(m);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", model_dir);
    }
    m->weight_owner = rlx__weight_owner_new();
    rlx_status rc = rlx__model_path_is_gguf(model_dir, &m->gguf);
    if (rc == RLX_OK)
        rc = rlx_weights_open(model_dir, &m->weights);
    if (rc == RLX_OK)
        rc =
            m->gguf ? rlx__model_config_from_gguf(m->weights, &m->cfg) : rlx__model_config_load_dir(model_dir, &m->cfg);
    if (rc != RLX_OK) {
        rlx_model_close(m);
        return rc;
    }
    /* the configuration was the last reader of the metadata: its pages need not stay resident */
    rlx__weights_release_gguf_headers(m->weights);
    *out = m;
    return RLX_OK;
}

void rlx_model_close(rlx_model *m) {
    if (!m)
        return;
    rlx__weight_owner_release(m->weight_owner);
    rlx_weights_close(m->weights);
    for (size_t i = 0; i < m->n_added; i++)
        rlx_weights_close(m->added[i]);
    free(m->added);
    free(m->dir);
    free(m);
}

rlx_status rlx_model_quantize(rlx_model *m, const char *type, rlx_quantize_progress progress, void *ctx) {
    if (!m || !type)
        return rlx_error(RLX_E_INVALID, "rlx_model_quantize: NULL argument");
    const rlx__qtype *q = rlx__qtype_find(type);
    if (!q)
        return rlx_error(RLX_E_INVALID, "unknown quantization type '%s' (one of %s)", type, rlx__qtype_names());
    if (m->gguf)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: a GGUF model keeps its file's types; quantize it with rlx quantize",
                         m->dir);
    m->quantized = true; /* also after a failure half way: some buffers may be in place */
    return rlx__weights_quantize(m->weights, &m->cfg, q, progress, ctx);
}

/* The tensor called name in the model's safetensors or an added file, or NULL. */
static const rlx_weight *model_find(const rlx_model *m, const char *name) {
    const rlx_weight *w = rlx_weights_find(m->weights, name);
    for (size_t i = 0; !w && i < m->n_added; i++)
        w = rlx_weights_find(m->added[i], name);
    return w;
}

rlx_status rlx_model_add_weights(rlx_model *m, const char *safetensors_path) {
    if (!m || !safetensors_path)
        return rlx_error(RLX_E_INVALID, "rlx_model_add_weights: NULL argument");
    rlx_weights *w;
    rlx_status rc = rlx__weights_open_file(safetensors_path, &w);
    if (rc != RLX_OK)
        return rc;
    /* a tensor in two files would make the weights a block gets depend on the search order */
    for (size_t i = 0; i < rlx_weights_count(w); i++) {
        const rlx_weight *t = rlx_weights_at(w, i), *dup = model_find(m, t->name);
        if (dup) {
            rc = rlx_error(RLX_E_FORMAT, "tensor '%s' is in both %s and %s", t->name, dup->file, t->file);
            rlx_weights_close(w);
            return rc;
        }
    }
    rlx_weights **added = rlx__realloc(m->added, (m->n_added + 1) * sizeof *added);
    if (!added) {
        rlx_weights_close(w);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", safetensors_path);
    }
    m->added = added;
    m->added[m->n_added++] = w;
    return RLX_OK;
}

int rlx_model_has_mtp(const rlx_model *m, uint32_t n) {
    char name[96];
    snprintf(name, sizeof name, "model.mtp_layers.%u.input_proj.weight", n);
    return m && model_find(m, name) != NULL;
}

const rlx_model_config *rlx_model_config_of(const rlx_model *m) { return &m->cfg; }
const rlx_weights *rlx_model_weights(const rlx_model *m) { return m->weights; }
const char *rlx_model_dir(const rlx_model *m) { return m->dir; }

// ---- what a block reads ----

typedef struct need {
    char name[128];
    uint32_t n_dims;
    int64_t shape[2];
} need;

/* A list of needs; the first failure to grow it stays in rc and ends the listing (the same
 * sticky error as the graph builder's). */
typedef struct needs {
    need *items;
    size_t n, cap;
    rlx_status rc;
} needs;

static void add_need(needs *ns, int64_t rows, int64_t cols, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void add_need(needs *ns, int64_t rows, int64_t cols, const char *fmt, ...) {
    if (ns->rc != RLX_OK)
        return;
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? ns->cap * 2 : 64;
        need *items = rlx__realloc(ns->items, cap * sizeof *items);
        if (!items) {
            ns->rc = rlx_error(RLX_E_NOMEM, "model: out of memory");
            return;
        }
        ns->items = items;
        ns->cap = cap;
    }
    need *n = &ns->items[ns->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n->name, sizeof n->name, fmt, ap);
    va_end(ap);
    n->n_dims = cols ? 2 : 1;
    n->shape[0] = rows;
    n->shape[1] = cols;
}

static rlx_status check_spec(const rlx_model_config *c, const rlx_block_spec *s) {
    if (s->emit_hidden && !s->produce_logits)
        return rlx_error(RLX_E_INVALID, "a block emits final hidden states only with produce_logits");
    if (s->mtp) {
        if (s->layer_end != s->layer_start + 1 || !s->embed_input || !s->produce_logits)
            return rlx_error(RLX_E_INVALID,
                             "an MTP block is one MTP layer [N, N + 1) that embeds tokens and produces "
                             "logits (block [%u, %u), embed_input %u, produce_logits %u)",
                             s->layer_start, s->layer_end, s->embed_input, s->produce_logits);
        if (s->layer_start >= RLX_MAX_LAYERS)
            return rlx_error(RLX_E_RANGE, "MTP layer %u: at most %d MTP layers", s->layer_start, RLX_MAX_LAYERS);
        return RLX_OK;
    }
    if (s->layer_start >= s->layer_end || s->layer_end > (uint64_t)c->num_hidden_layers)
        return rlx_error(RLX_E_RANGE, "block layers [%u, %u) are not a non-empty range inside the model's %lld layers",
                         s->layer_start, s->layer_end, (long long)c->num_hidden_layers);
    return RLX_OK;
}

/* One decoder layer: where its tensors are and how it is configured. */
typedef struct layer_desc {
    char tensors[64]; /* safetensors name prefix: "model.layers.3." */
    char nodes[32];   /* graph name prefix: "layers.3." */
    uint32_t index;   /* rlx_op_params.layer */
    int moe;
    uint32_t window; /* sliding window in positions, 0 = full attention */
} layer_desc;

static layer_desc model_layer(const rlx_model_config *c, uint32_t l) {
    layer_desc d = {.index = l,
                    .moe = rlx_model_config_layer_is_moe(c, l),
                    .window = c->layer_sliding[l] ? (uint32_t)c->sliding_window : 0};
    snprintf(d.tensors, sizeof d.tensors, "model.layers.%u.", l);
    snprintf(d.nodes, sizeof d.nodes, "layers.%u.", l);
    return d;
}

static layer_desc mtp_layer(const rlx_model_config *c, uint32_t n) {
    layer_desc d = {.index = (uint32_t)c->num_hidden_layers + n};
    snprintf(d.tensors, sizeof d.tensors, "model.mtp_layers.%u.mtp_block.", n);
    snprintf(d.nodes, sizeof d.nodes, "mtp_layers.%u.", n);
    return d;
}

/* Appends, in the order the builder binds them, every weight of one decoder layer. */
static void layer_needs(const rlx_model_config *c, const layer_desc *l, needs *ns) {
    int64_t h = c->hidden_size, d = c->head_dim, q = c->num_attention_heads * d, kv = c->num_key_value_heads * d;
    const char *p = l->tensors;
    /* o_proj comes after the norms because that is when the builder uses it */
    const char *proj[4] = {"q", "k", "v", "o"};
    int64_t rows[4] = {q, kv, kv, h}, cols[4] = {h, h, h, q};
    add_need(ns, h, 0, "%sinput_layernorm.weight", p);
    for (int i = 0; i < 4; i++) {
        if (i == 3) {
            add_need(ns, d, 0, "%sself_attn.q_norm.weight", p);
            add_need(ns, d, 0, "%sself_attn.k_norm.weight", p);
        }
        add_need(ns, rows[i], cols[i], "%sself_attn.%s_proj.weight", p, proj[i]);
        if (c->attention_bias)
            add_need(ns, rows[i], 0, "%sself_attn.%s_proj.bias", p, proj[i]);
    }
    add_need(ns, h, 0, "%spost_attention_layernorm.weight", p);
    if (l->moe) {
        int64_t f = c->moe_intermediate_size;
        add_need(ns, c->num_experts, h, "%smlp.gate.weight", p);
        for (int64_t e = 0; e < c->num_experts; e++) {
            add_need(ns, f, h, "%smlp.experts.%lld.gate_proj.weight", p, (long long)e);
            add_need(ns, f, h, "%smlp.experts.%lld.up_proj.weight", p, (long long)e);
            add_need(ns, h, f, "%smlp.experts.%lld.down_proj.weight", p, (long long)e);
        }
    } else {
        int64_t f = c->intermediate_size;
        add_need(ns, f, h, "%smlp.gate_proj.weight", p);
        add_need(ns, f, h, "%smlp.up_proj.weight", p);
        add_need(ns, h, f, "%smlp.down_proj.weight", p);
    }
}

/* The final norm of an MTP layer: its own when it has one, else the target's. */
static void mtp_final_norm_name(const rlx_model *m, uint32_t n, char *name, size_t len) {
    snprintf(name, len, "model.mtp_layers.%u.final_layernorm.weight", n);
    if (!model_find(m, name))
        snprintf(name, len, "model.norm.weight");
}

static rlx_status block_needs(const rlx_model *m, const rlx_block_spec *s, needs *ns) {
    const rlx_model_config *c = &m->cfg;
    int64_t h = c->hidden_size;
    if ((ns->rc = check_spec(c, s)) != RLX_OK)
        return ns->rc;
    if (s->embed_input)
        add_need(ns, c->vocab_size, h, "model.embed_tokens.weight");
    if (s->mtp) {
        uint32_t n = s->layer_start;
        add_need(ns, h, 0, "model.mtp_layers.%u.token_layernorm.weight", n);
        add_need(ns, h, 0, "model.mtp_layers.%u.hidden_layernorm.weight", n);
        add_need(ns, h, 2 * h, "model.mtp_layers.%u.input_proj.weight", n);
        layer_desc l = mtp_layer(c, n);
        layer_needs(c, &l, ns);
    } else {
        for (uint32_t i = s->layer_start; i < s->layer_end; i++) {
            layer_desc l = model_layer(c, i);
            layer_needs(c, &l, ns);
        }
    }
    if (s->produce_logits) {
        char norm[96];
        if (s->mtp)
            mtp_final_norm_name(m, s->layer_start, norm, sizeof norm);
        else
            snprintf(norm, sizeof norm, "model.norm.weight");
        add_need(ns, h, 0, "%s", norm);
        /* with tied embeddings the LM head is the embedding table; a block that also embeds
         * lists it twice, and consumers skip the repeat */
        add_need(ns, c->vocab_size, c->hidden_size,
                 c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    }
    return ns->rc;
}

static const rlx_weight *find_checked(const rlx_model *m, const need *n, rlx_status *rc) {
    const rlx_weight *w = model_find(m, n->name);
    if (!w && strncmp(n->name, "model.mtp_layers.", 17) == 0) {
        *rc = rlx_error(RLX_E_NOT_FOUND,
                        "%s: MTP tensor '%s' is in neither the model's safetensors nor an added weights file; "
                        "give the MTP weights with the mtp speculator's option weights=FILE (--spec-opts) or as "
                        "mtp.safetensors in the model directory",
                        m->dir, n->name);
        return NULL;
    }
    if (!w) {
        *rc = rlx_error(RLX_E_NOT_FOUND, "%s: tensor '%s' is missing from the %s", m->dir, n->name,
                        m->gguf ? "GGUF file" : "safetensors");
        return NULL;
    }
    int ok = w->n_dims == n->n_dims && w->shape[0] == n->shape[0] && (n->n_dims == 1 || w->shape[1] == n->shape[1]);
    if (!ok) {
        char have[64] = "", want[64];
        size_t len = 0;
        for (uint32_t i = 0; i < w->n_dims; i++)
            len += (size_t)snprintf(have + len, sizeof have - len, i ? ",%lld" : "%lld", (long long)w->shape[i]);
        if (n->n_dims == 1)
            snprintf(want, sizeof want, "%lld", (long long)n->shape[0]);
        else
            snprintf(want, sizeof want, "%lld,%lld", (long long)n->shape[0], (long long)n->shape[1]);
        const char *stored = m->gguf ? rlx__weights_gguf_name(m->weights, w) : NULL;
        if (stored)
            *rc = rlx_error(RLX_E_SHAPE,
                            "%s: tensor '%s' (%s) has shape [%s], the GGUF metadata implies [%s] (shapes as [rows, "
                            "columns]; GGUF lists the dimensions the other way round)",
                            w->file, stored, n->name, have, want);
        else
            *rc = rlx_error(RLX_E_SHAPE, "%s: tensor '%s' has shape [%s], %s implies [%s]", w->file, n->name, have,
                            m->gguf ? "the GGUF metadata" : "config.json", want);
        return NULL;
    }
    const int is_float = w->dtype == RLX_DTYPE_F32 || w->dtype == RLX_DTYPE_BF16 || w->dtype == RLX_DTYPE_F16;
    /* matrices may be quantized, except a MoE router, whose logits pick the experts */
    const size_t len = strlen(n->name);
    const int router = len >= 15 && strcmp(n->name + len - 15, "mlp.gate.weight") == 0;
    if (!is_float && !(n->n_dims == 2 && !router && rlx_iface_dtype_is_quantized(w->dtype))) {
        *rc = rlx_error(RLX_E_FORMAT, "%s: tensor '%s' has dtype %s; %s must be f32, bf16 or f16", w->file, n->name,
                        rlx_dtype_name((int)w->dtype), n->n_dims == 2 ? "a router" : "vectors (norms, biases)");
        return NULL;
    }
    return w;
}

rlx_status rlx__block_spec_read(const rlx_block_spec *in, rlx_block_spec *out) {
    *out = (rlx_block_spec){0};
    return rlx__read_sized(out, sizeof *out, in, offsetof(rlx_block_spec, all_logits), "rlx_block_spec");
}

rlx_status rlx_model_check_block(const rlx_model *m, const rlx_block_spec *spec) {
    if (!m || !spec)
        return rlx_error(RLX_E_INVALID, "rlx_model_check_block: NULL argument");
    rlx_block_spec sp;
    rlx_status rc = rlx__block_spec_read(spec, &sp);
    if (rc != RLX_OK)
        return rc;
    needs ns = {0};
    rc = block_needs(m, &sp, &ns);
    for (size_t i = 0; rc == RLX_OK && i < ns.n; i++)
        find_checked(m, &ns.items[i], &rc);
    free(ns.items);
    return rc;
}

rlx_status rlx_model_block_weights(const rlx_model *m, const rlx_block_spec *spec,
                                   int (*fn)(void *ctx, const char *name), void *ctx) {
    if (!m || !spec || !fn)
        return rlx_error(RLX_E_INVALID, "rlx_model_block_weights: NULL argument");
    rlx_block_spec sp;
    rlx_status rc = rlx__block_spec_read(spec, &sp);
    if (rc != RLX_OK)
        return rc;
    spec = &sp;
    needs ns = {0};
    rc = block_needs(m, spec, &ns);
    for (size_t i = 0; rc == RLX_OK && i < ns.n; i++) {
        int repeat = i > 0 && spec->embed_input && strcmp(ns.items[i].name, ns.items[0].name) == 0;
        if (!repeat && fn(ctx, ns.items[i].name))
            break;
    }
    free(ns.items);
    return rc;
}

typedef struct prefetch {
    const rlx_model *m;
    size_t done, total;
    int counting;
    void (*progress)(void *ctx, size_t done, size_t total);
    void *ctx;
    unsigned char sink;
} prefetch;

static int prefetch_one(void *ctx, const char *name) {
    prefetch *p = ctx;
    const rlx_weight *w = model_find(p->m, name);
    if (!w)
        return 0; /* rlx_model_check_block reports missing tensors */
    if (p->counting) {
        p->total += w->nbytes;
        return 0;
    }
    const volatile unsigned char *bytes = w->data;
    const size_t page = 4096, step = 64 << 20;
    for (size_t at = 0; at < w->nbytes; at += step) {
        size_t end = at + step < w->nbytes ? at + step : w->nbytes;
        for (size_t i = at; i < end; i += page)
            p->sink ^= bytes[i];
        p->done += end - at;
        if (p->progress)
            p->progress(p->ctx, p->done, p->total);
    }
    return 0;
}

rlx_status rlx_model_prefetch(const rlx_model *m, const rlx_block_spec *spec,
                              void (*progress)(void *ctx, size_t done, size_t total), void *ctx) {
    prefetch p = {.m = m, .counting = 1, .progress = progress, .ctx = ctx};
    rlx_status rc = rlx_model_block_weights(m, spec, prefetch_one, &p);
    p.counting = 0;
    if (rc == RLX_OK)
        rc = rlx_model_block_weights(m, spec, prefetch_one, &p);
    return rc;
}

// ---- graph construction ----

typedef struct builder {
    const rlx_model *m;
    rlx_graph *g;
    const need *next; /* block_needs order: the builder consumes weights in the same order */
    const need *end;
    rlx_status rc;
} builder;

/* The next weight in block_needs order, declared in the graph (once per name). */
static int weight(builder *b) {
    if (b->rc != RLX_OK)
        return -1;
    if (b->next == b->end) {
        b->rc = rlx_error(RLX_E_INTERNAL, "model builder: weight list exhausted");
        return -1;
    }
    const need *n = b->next++;
    int id = rlx_graph_find_tensor(b->g, n->name);
    if (id >= 0)
        return id;
    const rlx_weight *w = find_checked(b->m, n, &b->rc);
    if (!w)
        return -1;
    id = rlx_graph_add_tensor(b->g, RLX_ROLE_WEIGHT, n->name, (rlx_dtype)w->dtype, w->n_dims, w->shape, w->data);
    if (id < 0)
        b->rc = id;
    return id;
}

/* An input or state tensor of the block; a failure is kept in b->rc like a node's. */
static int bound(builder *b, rlx_tensor_role role, const char *name, rlx_dtype dtype, uint32_t n_dims,
                 const int64_t *shape) {
    if (b->rc != RLX_OK)
        return -1;
    int id = rlx_graph_add_tensor(b->g, role, name, dtype, n_dims, shape, NULL);
    if (id < 0)
        b->rc = id;
    return id;
}

static int node(builder *b, rlx_op op, const char *name, const int *in, uint32_t n, const rlx_op_params *p) {
    if (b->rc != RLX_OK)
        return -1;
    int id = rlx_graph_add_node(b->g, op, name, in, n, p);
    if (id < 0)
        b->rc = id;
    return id;
}

static int node2(builder *b, rlx_op op, const char *name, int x, int y, const rlx_op_params *p) {
    return node(b, op, name, (int[]){x, y}, 2, p);
}

static int linear(builder *b, const rlx_model_config *c, const char *name, int x) {
    int w = weight(b);
    if (!c->attention_bias)
        return node2(b, RLX_OP_MATMUL, name, x, w, NULL);
    int bias = weight(b);
    return node(b, RLX_OP_MATMUL, name, (int[]){x, w, bias}, 3, NULL);
}

/* seq: the rows' slots with caches of several sequences, else -1 */
static int build_layer(builder *b, const layer_desc *l, int x, int pos, int seq, int kc, int vc) {
    const rlx_model_config *c = &b->m->cfg;
    char name[96];
    rlx_op_params norm = {.eps = (float)c->rms_norm_eps, .layer = l->index};
    rlx_op_params rope = {.rope_theta = (float)c->rope_theta, .head_dim = (uint32_t)c->head_dim, .layer = l->index};
    rlx_op_params attn = {.scale = (float)(1.0 / sqrt((double)c->head_dim)),
                          .head_dim = (uint32_t)c->head_dim,
                          .n_heads = (uint32_t)c->num_attention_heads,
                          .n_kv_heads = (uint32_t)c->num_key_value_heads,
                          .window = l->window,
                          .layer = l->index};
#define NAME(suffix) (snprintf(name, sizeof name, "%s%s", l->nodes, suffix), name)
    int h = node2(b, RLX_OP_RMS_NORM, NAME("input_norm"), x, weight(b), &norm);
    int q = linear(b, c, NAME("attn.q_proj"), h);
    int k = linear(b, c, NAME("attn.k_proj"), h);
    int v = linear(b, c, NAME("attn.v_proj"), h);
    q = node2(b, RLX_OP_RMS_NORM, NAME("attn.q_norm"), q, weight(b), &norm);
    k = node2(b, RLX_OP_RMS_NORM, NAME("attn.k_norm"), k, weight(b), &norm);
    q = node2(b, RLX_OP_ROPE, NAME("attn.q_rope"), q, pos, &rope);
    k = node2(b, RLX_OP_ROPE, NAME("attn.k_rope"), k, pos, &rope);
    int a =
        node(b, RLX_OP_ATTENTION, NAME("attn.attention"), (int[]){q, k, v, pos, kc, vc, seq}, seq >= 0 ? 7 : 6, &attn);
    int o = linear(b, c, NAME("attn.o_proj"), a);
    x = node2(b, RLX_OP_ADD, NAME("attn.residual"), x, o, NULL);
    h = node2(b, RLX_OP_RMS_NORM, NAME("post_attn_norm"), x, weight(b), &norm);
    int mlp;
    if (l->moe) {
        uint32_t n_in = 2 + 3 * (uint32_t)c->num_experts;
        int *in = rlx__malloc(n_in * sizeof *in);
        if (!in) {
            b->rc = rlx_error(RLX_E_NOMEM, "model builder: out of memory");
            return -1;
        }
        in[0] = h;
        for (uint32_t i = 1; i < n_in; i++)
            in[i] = weight(b);
        rlx_op_params moe = {.n_experts = (uint32_t)c->num_experts,
                             .top_k = (uint32_t)c->num_experts_per_tok,
                             .norm_topk = (uint32_t)c->norm_topk_prob,
                             .layer = l->index};
        mlp = node(b, RLX_OP_MOE, NAME("mlp.moe"), in, n_in, &moe);
        free(in);
    } else {
        int gate = node2(b, RLX_OP_MATMUL, NAME("mlp.gate_proj"), h, weight(b), NULL);
        int up = node2(b, RLX_OP_MATMUL, NAME("mlp.up_proj"), h, weight(b), NULL);
        int act = node2(b, RLX_OP_SWIGLU, NAME("mlp.swiglu"), gate, up, NULL);
        mlp = node2(b, RLX_OP_MATMUL, NAME("mlp.down_proj"), act, weight(b), NULL);
    }
    return node2(b, RLX_OP_ADD, NAME("mlp.residual"), x, mlp, NULL);
#undef NAME
}

rlx_status rlx_model_build_block(const rlx_model *m, const rlx_block_spec *spec, uint32_t n_tokens,
                                 uint32_t kv_capacity, rlx_graph **graph, rlx_block_io *io) {
    if (!io)
        return rlx_error(RLX_E_INVALID, "rlx_model_build_block: NULL argument");
    rlx_build_options o = {.size = sizeof o, .n_tokens = n_tokens, .kv_capacity = kv_capacity};
    rlx_batch_io bio;
    rlx_status rc = rlx_model_build_block_ex(m, spec, &o, graph, &bio);
    *io = bio.block;
    return rc;
}

rlx_status rlx_model_build_block_ex(const rlx_model *m, const rlx_block_spec *spec, const rlx_build_options *opts,
                                    rlx_graph **graph, rlx_batch_io *bio) {
    if (!m || !spec || !opts || !graph || !bio)
        return rlx_error(RLX_E_INVALID, "rlx_model_build_block_ex: NULL argument");
    *graph = NULL;
    memset(bio, 0, sizeof *bio);
    bio->seq = bio->out_rows = -1;
    rlx_block_io *io = &bio->block;
    rlx_block_spec sp;
    rlx_status rc = rlx__block_spec_read(spec, &sp);
    if (rc != RLX_OK)
        return rc;
    spec = &sp;
    rlx_build_options o = {.size = sizeof o};
    if ((rc = rlx__read_sized(&o, sizeof o, opts, offsetof(rlx_build_options, n_slots), "rlx_build_options")) != RLX_OK)
        return rc;
    const uint32_t n_tokens = o.n_tokens, kv_capacity = o.kv_capacity;
    if (n_tokens == 0 || kv_capacity == 0 || (o.n_slots == 0 && n_tokens > kv_capacity))
        return rlx_error(RLX_E_INVALID, "block of %u tokens with a KV cache of %u positions", n_tokens, kv_capacity);
    if (o.kv_dtype != RLX_DTYPE_F32 && o.kv_dtype != RLX_DTYPE_F16)
        return rlx_error(RLX_E_INVALID, "KV cache dtype %s: only f32 and f16 caches exist", rlx_dtype_name(o.kv_dtype));
    if (o.n_out_rows && (!o.n_slots || !spec->produce_logits || o.n_out_rows > n_tokens))
        return rlx_error(RLX_E_INVALID,
                         "%u logits rows of %u: picking rows needs n_slots, a logits block and at most "
                         "one pick per row",
                         o.n_out_rows, n_tokens);
    if (o.n_slots && (spec->mtp || spec->emit_hidden))
        return rlx_error(RLX_E_UNSUPPORTED, "a block of several sequences has no MTP layer or hidden output yet");
    const rlx_model_config *c = &m->cfg;
    needs ns = {0};
    builder b = {.m = m};
    b.rc = block_needs(m, spec, &ns);
    if (b.rc == RLX_OK)
        b.rc = rlx_graph_create(&b.g);
    if (b.rc != RLX_OK) {
        free(ns.items);
        return b.rc;
    }
    rlx__graph_set_weights(b.g, m->weight_owner, m->quantized ? 0 : RLX_WEIGHT_FILE_BACKED | RLX_WEIGHT_READ_ONLY);
    b.next = ns.items;
    b.end = ns.items + ns.n;
    memset(io, 0, sizeof *io);
    io->hidden = io->hidden_input = -1;
    io->n_layers = spec->layer_end - spec->layer_start;
    int64_t t = n_tokens, hidden = c->hidden_size;
    const int64_t kv_cols = c->num_key_value_heads * c->head_dim;
    const int64_t kv_shape[3] = {o.n_slots, kv_capacity, kv_cols};
    const uint32_t kv_dims = o.n_slots ? 3 : 2;
    rlx_op_params norm = {.eps = (float)c->rms_norm_eps, .layer = UINT32_MAX};
    int x;
    if (spec->embed_input) {
        io->input = bound(&b, RLX_ROLE_INPUT, "tokens", RLX_DTYPE_I32, 1, &t);
        x = node2(&b, RLX_OP_EMBED, "embed", io->input, weight(&b), NULL);
    } else {
        io->input = bound(&b, RLX_ROLE_INPUT, "hidden_in", RLX_DTYPE_F32, 2, (int64_t[]){t, hidden});
        x = io->input;
    }
    if (spec->mtp) {
        /* pairs (token x[t+1], target hidden h[t]): input_proj(concat(g, e)) in MiMo's order */
        io->hidden_input = bound(&b, RLX_ROLE_INPUT, "hidden_in", RLX_DTYPE_F32, 2, (int64_t[]){t, hidden});
        int e = node2(&b, RLX_OP_RMS_NORM, "mtp.token_norm", x, weight(&b), &norm);
        int g = node2(&b, RLX_OP_RMS_NORM, "mtp.hidden_norm", io->hidden_input, weight(&b), &norm);
        int ge = node2(&b, RLX_OP_CONCAT, "mtp.concat", g, e, NULL);
        x = node2(&b, RLX_OP_MATMUL, "mtp.input_proj", ge, weight(&b), NULL);
    }
    io->positions = bound(&b, RLX_ROLE_INPUT, "positions", RLX_DTYPE_I32, 1, &t);
    if (o.n_slots)
        bio->seq = bound(&b, RLX_ROLE_INPUT, "slots", RLX_DTYPE_I32, 1, &t);
    for (uint32_t l = spec->layer_start; b.rc == RLX_OK && l < spec->layer_end; l++) {
        layer_desc desc = spec->mtp ? mtp_layer(c, l) : model_layer(c, l);
        char kname[64], vname[64];
        snprintf(kname, sizeof kname, "%sk_cache", desc.nodes);
        snprintf(vname, sizeof vname, "%sv_cache", desc.nodes);
        const int64_t *shape = o.n_slots ? kv_shape : kv_shape + 1;
        int kc = bound(&b, RLX_ROLE_STATE, kname, (rlx_dtype)o.kv_dtype, kv_dims, shape);
        int vc = bound(&b, RLX_ROLE_STATE, vname, (rlx_dtype)o.kv_dtype, kv_dims, shape);
        if (b.rc != RLX_OK)
            break;
        io->k_cache[l - spec->layer_start] = kc;
        io->v_cache[l - spec->layer_start] = vc;
        x = build_layer(&b, &desc, x, io->positions, bio->seq, kc, vc);
    }
    if (spec->produce_logits) {
        if (spec->emit_hidden) {
            /* the norm is per row, so norming every row before picking the last changes nothing */
            x = node2(&b, RLX_OP_RMS_NORM, "final_norm", x, weight(&b), &norm);
            io->hidden = x;
            if (b.rc == RLX_OK)
                b.rc = rlx_graph_mark_output(b.g, x);
            if (!spec->all_logits)
                x = node(&b, RLX_OP_GATHER_LAST, "last_position", &x, 1, NULL);
        } else if (o.n_out_rows) {
            int64_t r = o.n_out_rows;
            bio->out_rows = bound(&b, RLX_ROLE_INPUT, "logits_rows", RLX_DTYPE_I32, 1, &r);
            x = node2(&b, RLX_OP_GATHER_ROWS, "logits_rows", x, bio->out_rows, NULL);
            x = node2(&b, RLX_OP_RMS_NORM, "final_norm", x, weight(&b), &norm);
        } else {
            if (!spec->all_logits)
                x = node(&b, RLX_OP_GATHER_LAST, "last_position", &x, 1, NULL);
            x = node2(&b, RLX_OP_RMS_NORM, "final_norm", x, weight(&b), &norm);
        }
        x = node2(&b, RLX_OP_MATMUL, "lm_head", x, weight(&b), NULL);
    }
    io->output = x;
    if (b.rc == RLX_OK)
        b.rc = rlx_graph_mark_output(b.g, x);
    free(ns.items);
    if (b.rc != RLX_OK) {
        rlx_graph_destroy(b.g);
        return b.rc;
    }
    *graph = b.g;
    return RLX_OK;
}
