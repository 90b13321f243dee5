/* Models and the block builder. The architecture (arch.h) says which tensors a layer has and
 * builds it; the weights a block needs (the weight filter, prefetch and the pre-build check) are
 * derived here from the same table the builder resolves its weights by role from.
 *
 * An MTP block's decoder layer is built by the same code as the model's layers, from the tensors
 * under model.mtp_layers.N.mtp_block.; it is configured as a layer after the target's last
 * (DeepSeek-V3 numbers its MTP layers so): a dense MLP of intermediate_size and full attention. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
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
    rlx__model_desc desc;
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
    rlx_status rc = rlx_weights_open(model_dir, &m->weights);
    if (rc == RLX_OK)
        rc = (m->gguf = rlx__weights_gguf(m->weights) != NULL) ? rlx__model_desc_from_gguf(m->weights, &m->desc)
                                                               : rlx__model_desc_load_dir(model_dir, &m->desc);
    if (rc == RLX_OK && m->desc.arch->fix_weights)
        rc = m->desc.arch->fix_weights(m->weights, &m->desc, m->gguf);
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
    rlx__model_desc_free(&m->desc);
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
    return rlx__weights_quantize(m->weights, &m->desc, q, progress, ctx);
}

/* The tensor called name in the model's safetensors or an added file, or NULL. */
const rlx_weight *rlx__model_find(const rlx_model *m, const char *name) {
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
        const rlx_weight *t = rlx_weights_at(w, i), *dup = rlx__model_find(m, t->name);
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
    char name[160];
    return m && rlx__mtp_name(rlx__arch_mtp(m->desc.arch)->proj, n, name, sizeof name) &&
           rlx__model_find(m, name) != NULL;
}

const rlx_model_config *rlx_model_config_of(const rlx_model *m) { return &m->desc.cfg; }
const rlx__model_desc *rlx__model_desc_of(const rlx_model *m) { return &m->desc; }

int rlx__model_layer_linear(const rlx_model *m, uint32_t layer) {
    return layer < m->desc.cfg.num_hidden_layers && m->desc.layers[layer].linear;
}

int rlx__model_recurrent(const rlx_model *m, const rlx_block_spec *spec) {
    for (uint32_t l = spec->layer_start; !spec->mtp && l < spec->layer_end; l++)
        if (rlx__model_layer_linear(m, l))
            return 1;
    return 0;
}

/* The shapes of layer l's two per-sequence tensors: the KV cache's rows, or for a linear layer
 * the convolution's last inputs and the delta rule's state, all F32. */
static void layer_state_shapes(const rlx__model_desc *d, uint32_t l, uint32_t capacity, int64_t k[3], int64_t v[3],
                               uint32_t *dims) {
    const rlx__gdn *g = &d->gdn;
    if (l < d->cfg.num_hidden_layers && d->layers[l].linear) {
        k[0] = g->conv_kernel - 1;
        k[1] = 2 * g->k_heads * g->k_dim + g->v_heads * g->v_dim;
        v[0] = g->v_heads;
        v[1] = g->k_dim;
        v[2] = g->v_dim;
        dims[0] = 2;
        dims[1] = 3;
        return;
    }
    k[0] = v[0] = capacity;
    k[1] = v[1] = d->cfg.num_key_value_heads * d->cfg.head_dim;
    dims[0] = dims[1] = 2;
}

size_t rlx__layer_cache_bytes(const rlx_model *m, uint32_t layer, uint32_t capacity, uint32_t kv_dtype, int which) {
    int64_t shape[2][3];
    uint32_t dims[2];
    layer_state_shapes(&m->desc, layer, capacity, shape[0], shape[1], dims);
    const uint32_t dtype = rlx__model_layer_linear(m, layer) ? RLX_DTYPE_F32 : kv_dtype;
    size_t bytes = rlx_iface_row_bytes(dtype, shape[which][dims[which] - 1]);
    for (uint32_t i = 0; i + 1 < dims[which]; i++)
        bytes *= (size_t)shape[which][i];
    return bytes;
}

rlx_status rlx__kv_dtype_check(const rlx_model *m, uint32_t kv_dtype) {
    const int64_t head_dim = m->desc.cfg.head_dim;
    if (kv_dtype != RLX_DTYPE_F32 && kv_dtype != RLX_DTYPE_F16 && kv_dtype != RLX_DTYPE_Q8_0)
        return rlx_error(RLX_E_INVALID, "KV cache dtype %s: the caches are f32, f16 or q8_0",
                         rlx_dtype_name((int)kv_dtype));
    /* each head's slice of a cache row must be whole blocks, as attention reads it per head */
    if (rlx_iface_row_bytes(kv_dtype, head_dim) == 0)
        return rlx_error(
            RLX_E_UNSUPPORTED, "KV cache dtype %s needs a head_dim that is a multiple of %lld; this model's is %lld",
            rlx_dtype_name((int)kv_dtype), (long long)rlx_iface_dtype_block(kv_dtype), (long long)head_dim);
    return RLX_OK;
}

int rlx__model_weight_in_memory(const rlx_model *m, const rlx_weight *w) {
    if (m->quantized) /* every weight is offered without flags already */
        return 0;
    for (size_t i = 0; i < m->weights->n_owned; i++)
        if (m->weights->owned[i] == w->data)
            return 1;
    return 0;
}
const rlx_weights *rlx_model_weights(const rlx_model *m) { return m->weights; }
const char *rlx_model_dir(const rlx_model *m) { return m->dir; }

/* Writes the members of src (src_size bytes, a uint32_t size first) that the caller's struct
 * at dst, by its size, has room for. */
static rlx_status write_sized(void *dst, const void *src, size_t src_size, size_t min_size, const char *type) {
    uint32_t size;
    memcpy(&size, dst, sizeof size);
    if (size < min_size)
        return rlx_error(RLX_E_INVALID,
                         "%s.size is %u, below the %zu bytes of its first version (set it to sizeof(%s))", type, size,
                         min_size, type);
    memcpy((uint8_t *)dst + sizeof size, (const uint8_t *)src + sizeof size,
           (size < src_size ? size : src_size) - sizeof size);
    return RLX_OK;
}

rlx_status rlx_model_arch_info_of(const rlx_model *m, rlx_model_arch_info *out) {
    if (!m || !out)
        return rlx_error(RLX_E_INVALID, "rlx_model_arch_info_of: NULL argument");
    const rlx__model_desc *d = &m->desc;
    const rlx__tensor *q_norm = rlx__arch_tensor(d->arch, RLX__R_ATTN_Q_NORM);
    rlx_model_arch_info info = {.size = sizeof info,
                                .qk_norm = q_norm && !q_norm->optional && q_norm->when == RLX__ALWAYS,
                                .qkv_bias = d->qkv_bias,
                                .o_bias = d->o_bias,
                                .rope_type = (uint32_t)d->rope_type};
    snprintf(info.arch, sizeof info.arch, "%s", d->arch->name);
    return write_sized(out, &info, sizeof info, offsetof(rlx_model_arch_info, arch) + sizeof info.arch,
                       "rlx_model_arch_info");
}

rlx_status rlx_model_layer_info_of(const rlx_model *m, uint32_t layer, rlx_model_layer_info *out) {
    if (!m || !out)
        return rlx_error(RLX_E_INVALID, "rlx_model_layer_info_of: NULL argument");
    if (layer >= m->desc.cfg.num_hidden_layers)
        return rlx_error(RLX_E_RANGE, "layer %u of a model of %lld layers", layer,
                         (long long)m->desc.cfg.num_hidden_layers);
    const rlx__layer *l = &m->desc.layers[layer];
    rlx_model_layer_info info = {.size = sizeof info, .window = l->window, .moe = l->moe, .linear = l->linear};
    return write_sized(out, &info, sizeof info, offsetof(rlx_model_layer_info, moe) + sizeof info.moe,
                       "rlx_model_layer_info");
}

// ---- what a block reads ----

typedef struct need {
    char name[128];
    int64_t rows, cols; /* cols 0: a vector */
    int router;
} need;

/* A list of needs; the first failure to grow it stays in rc and ends the listing (the same
 * sticky error as the graph builder's). */
typedef struct needs {
    need *items;
    size_t n, cap;
    rlx_status rc;
} needs;

static need *add_need(needs *ns, int64_t rows, int64_t cols) {
    if (ns->rc != RLX_OK)
        return NULL;
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? ns->cap * 2 : 64;
        need *items = rlx__realloc(ns->items, cap * sizeof *items);
        if (!items) {
            ns->rc = rlx_error(RLX_E_NOMEM, "model: out of memory");
            return NULL;
        }
        ns->items = items;
        ns->cap = cap;
    }
    need *n = &ns->items[ns->n++];
    n->rows = rows;
    n->cols = cols;
    n->router = 0;
    return n;
}

static void add_named(needs *ns, int64_t rows, int64_t cols, const char *name) {
    need *n = add_need(ns, rows, cols);
    if (n)
        snprintf(n->name, sizeof n->name, "%s", name);
}

/* The tensor of table row t (expert e, else -1) under prefix. */
static void add_row(needs *ns, const rlx__model_desc *d, const rlx__tensor *t, const char *prefix, int64_t e) {
    int64_t rows, cols;
    rlx__role_shape(t->role, d, &rows, &cols);
    need *n = add_need(ns, rows, cols);
    if (!n)
        return;
    rlx__tensor_hf_name(t, prefix, e, n->name, sizeof n->name);
    n->router = t->role == RLX__R_FFN_ROUTER;
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

static rlx__blk_layer model_layer(const rlx__model_desc *d, uint32_t l) {
    rlx__blk_layer desc = {.index = l, .kind = d->layers[l]};
    snprintf(desc.tensors, sizeof desc.tensors, "model.layers.%u.", l);
    snprintf(desc.nodes, sizeof desc.nodes, "layers.%u.", l);
    return desc;
}

static rlx__blk_layer mtp_layer(const rlx__model_desc *d, uint32_t n) {
    rlx__blk_layer desc = {.index = (uint32_t)d->cfg.num_hidden_layers + n};
    desc.kind.moe = rlx__arch_mtp(d->arch)->layer_moe && d->cfg.num_experts > 0;
    rlx__mtp_name(rlx__arch_mtp(d->arch)->layer, n, desc.tensors, sizeof desc.tensors);
    snprintf(desc.nodes, sizeof desc.nodes, "mtp_layers.%u.", n);
    return desc;
}

/* Every tensor of one decoder layer that its architecture's table gives it. */
static void layer_needs(const rlx_model *m, const rlx__blk_layer *l, needs *ns) {
    const rlx__model_desc *d = &m->desc;
    for (const rlx__tensor *t = d->arch->tensors; t->hf; t++) {
        if (rlx__role_is_top(t->role) || !rlx__tensor_applies(t, d, &l->kind))
            continue;
        if (rlx__role_is_expert(t->role)) {
            for (int64_t e = 0; e < d->cfg.num_experts; e++)
                add_row(ns, d, t, l->tensors, e);
            continue;
        }
        if (t->optional) {
            char name[160];
            rlx__tensor_hf_name(t, l->tensors, -1, name, sizeof name);
            if (!rlx__model_find(m, name))
                continue;
        }
        add_row(ns, d, t, l->tensors, -1);
    }
}

/* MTP layer n's tensor of pattern (rlx__mtp_names); a layer its architecture's checkpoints do
 * not have is an error. */
static void add_mtp_need(needs *ns, const rlx_model *m, const char *pattern, uint32_t n, int64_t rows, int64_t cols) {
    need *x = add_need(ns, rows, cols);
    if (x && !rlx__mtp_name(pattern, n, x->name, sizeof x->name))
        ns->rc = rlx_error(RLX_E_NOT_FOUND, "%s: %s checkpoints have one MTP layer, not layer %u", m->dir,
                           m->desc.arch->name, n);
}

/* The top-level tensor of role (the architecture's table has every one). */
static void top_need(const rlx__model_desc *d, rlx__role role, needs *ns) {
    const rlx__tensor *t = rlx__arch_tensor(d->arch, role);
    if (t)
        add_row(ns, d, t, "", -1);
    else if (ns->rc == RLX_OK)
        ns->rc = rlx_error(RLX_E_INTERNAL, "architecture %s has no top-level tensor of role %d", d->arch->name, role);
}

/* The final norm of an MTP layer: its own when it has one, else the target's. */
static void mtp_final_norm_name(const rlx_model *m, uint32_t n, char *name, size_t len) {
    if (!rlx__mtp_name(rlx__arch_mtp(m->desc.arch)->final_norm, n, name, len) || !rlx__model_find(m, name))
        rlx__tensor_hf_name(rlx__arch_tensor(m->desc.arch, RLX__R_OUTPUT_NORM), "", -1, name, len);
}

static rlx_status block_needs(const rlx_model *m, const rlx_block_spec *s, needs *ns) {
    const rlx__model_desc *d = &m->desc;
    const rlx_model_config *c = &d->cfg;
    int64_t h = c->hidden_size;
    if ((ns->rc = check_spec(c, s)) != RLX_OK)
        return ns->rc;
    /* with tied embeddings the LM head is the embedding table, listed once */
    if (s->embed_input || (s->produce_logits && c->tie_word_embeddings))
        top_need(d, RLX__R_TOKEN_EMBD, ns);
    if (s->mtp) {
        const uint32_t n = s->layer_start;
        const rlx__mtp_names *names = rlx__arch_mtp(d->arch);
        add_mtp_need(ns, m, names->token_norm, n, h, 0);
        add_mtp_need(ns, m, names->hidden_norm, n, h, 0);
        add_mtp_need(ns, m, names->proj, n, h, 2 * h);
        rlx__blk_layer l = mtp_layer(d, n);
        layer_needs(m, &l, ns);
    } else {
        for (uint32_t i = s->layer_start; i < s->layer_end; i++) {
            rlx__blk_layer l = model_layer(d, i);
            layer_needs(m, &l, ns);
        }
    }
    if (s->produce_logits) {
        if (s->mtp) {
            char norm[128];
            mtp_final_norm_name(m, s->layer_start, norm, sizeof norm);
            add_named(ns, h, 0, norm);
        } else {
            top_need(d, RLX__R_OUTPUT_NORM, ns);
        }
        if (!c->tie_word_embeddings)
            top_need(d, RLX__R_OUTPUT, ns);
    }
    return ns->rc;
}

/* Whether name is one of the architecture's MTP tensors (its patterns up to their "{N}"). */
static int is_mtp_name(const rlx_model *m, const char *name) {
    const rlx__mtp_names *n = rlx__arch_mtp(m->desc.arch);
    const char *const patterns[] = {n->token_norm, n->hidden_norm, n->proj, n->final_norm, n->layer};
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++)
        if (strncmp(name, patterns[i], strcspn(patterns[i], "{")) == 0)
            return 1;
    return 0;
}

const rlx_weight *rlx__check_weight(const rlx_model *m, const char *name, const rlx_weight *w, int64_t rows,
                                    int64_t cols, int router, rlx_status *rc) {
    if (!w && is_mtp_name(m, name)) {
        *rc = rlx_error(RLX_E_NOT_FOUND,
                        "%s: MTP tensor '%s' is in neither the model's safetensors nor an added weights file; "
                        "give the MTP weights with the mtp speculator's option weights=FILE (--spec-opts) or as "
                        "mtp.safetensors in the model directory",
                        m->dir, name);
        return NULL;
    }
    if (!w) {
        *rc = rlx_error(RLX_E_NOT_FOUND, "%s: tensor '%s' is missing from the %s", m->dir, name,
                        m->gguf ? "GGUF file" : "safetensors");
        return NULL;
    }
    const uint32_t n_dims = cols ? 2 : 1;
    int ok = w->n_dims == n_dims && w->shape[0] == rows && (n_dims == 1 || w->shape[1] == cols);
    if (!ok) {
        char have[64] = "", want[64];
        size_t len = 0;
        for (uint32_t i = 0; i < w->n_dims; i++)
            len += (size_t)snprintf(have + len, sizeof have - len, i ? ",%lld" : "%lld", (long long)w->shape[i]);
        if (n_dims == 1)
            snprintf(want, sizeof want, "%lld", (long long)rows);
        else
            snprintf(want, sizeof want, "%lld,%lld", (long long)rows, (long long)cols);
        const char *stored = m->gguf ? rlx__weights_gguf_name(m->weights, w) : NULL;
        if (stored)
            *rc = rlx_error(RLX_E_SHAPE,
                            "%s: tensor '%s' (%s) has shape [%s], the GGUF metadata implies [%s] (shapes as [rows, "
                            "columns]; GGUF lists the dimensions the other way round)",
                            w->file, stored, name, have, want);
        else
            *rc = rlx_error(RLX_E_SHAPE, "%s: tensor '%s' has shape [%s], %s implies [%s]", w->file, name, have,
                            m->gguf ? "the GGUF metadata" : "config.json", want);
        return NULL;
    }
    const int is_float = w->dtype == RLX_DTYPE_F32 || w->dtype == RLX_DTYPE_BF16 || w->dtype == RLX_DTYPE_F16;
    /* matrices may be quantized, except a MoE router, whose logits pick the experts */
    if (!is_float && !(n_dims == 2 && !router && rlx_iface_dtype_is_quantized(w->dtype))) {
        *rc = rlx_error(RLX_E_FORMAT, "%s: tensor '%s' has dtype %s; %s must be f32, bf16 or f16", w->file, name,
                        rlx_dtype_name((int)w->dtype), n_dims == 2 ? "a router" : "vectors (norms, biases)");
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
    for (size_t i = 0; rc == RLX_OK && i < ns.n; i++) {
        const need *n = &ns.items[i];
        rlx__check_weight(m, n->name, rlx__model_find(m, n->name), n->rows, n->cols, n->router, &rc);
    }
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
    needs ns = {0};
    rc = block_needs(m, &sp, &ns);
    for (size_t i = 0; rc == RLX_OK && i < ns.n; i++)
        if (fn(ctx, ns.items[i].name))
            break;
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
    const rlx_weight *w = rlx__model_find(p->m, name);
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

/* The MTP input: pairs (token x[t+1], target hidden h[t]) through input_proj(concat(g, e)) in
 * MiMo's order; x is the embedded tokens. */
static int mtp_input(rlx__blk *b, uint32_t n, int x, int hidden_input) {
    const int64_t h = b->d->cfg.hidden_size;
    const rlx__mtp_names *names = rlx__arch_mtp(b->d->arch);
    char name[160];
    rlx__mtp_name(names->token_norm, n, name, sizeof name);
    int e = rlx__blk_rms_norm(b, "mtp.token_norm", x, rlx__blk_named_weight(b, name, h, 0));
    rlx__mtp_name(names->hidden_norm, n, name, sizeof name);
    int g = rlx__blk_rms_norm(b, "mtp.hidden_norm", hidden_input, rlx__blk_named_weight(b, name, h, 0));
    int ge = names->embedding_first ? rlx__blk_node2(b, RLX_OP_CONCAT, "mtp.concat", e, g, NULL)
                                    : rlx__blk_node2(b, RLX_OP_CONCAT, "mtp.concat", g, e, NULL);
    rlx__mtp_name(names->proj, n, name, sizeof name);
    return rlx__blk_node2(b, RLX_OP_MATMUL, "mtp.input_proj", ge, rlx__blk_named_weight(b, name, h, 2 * h), NULL);
}

/* The final norm: the model's, or for an MTP block its own (or else the model's). */
static int final_norm(rlx__blk *b, const rlx_block_spec *spec, int x) {
    if (!spec->mtp)
        return rlx__blk_rms_norm(b, "final_norm", x, rlx__blk_weight(b, RLX__R_OUTPUT_NORM, -1));
    char name[128];
    mtp_final_norm_name(b->m, spec->layer_start, name, sizeof name);
    return rlx__blk_rms_norm(b, "final_norm", x, rlx__blk_named_weight(b, name, b->d->cfg.hidden_size, 0));
}

rlx_status rlx_model_build_block(const rlx_model *m, const rlx_block_spec *spec, const rlx_build_options *opts,
                                 rlx_graph **graph, rlx_batch_io *bio) {
    return rlx__model_build_block(m, spec, opts, graph, bio, NULL);
}

rlx_status rlx__model_build_block(const rlx_model *m, const rlx_block_spec *spec, const rlx_build_options *opts,
                                  rlx_graph **graph, rlx_batch_io *bio, rlx__state_rows_io *rows) {
    if (!m || !spec || !opts || !graph || !bio)
        return rlx_error(RLX_E_INVALID, "rlx_model_build_block: NULL argument");
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
    if ((rc = rlx__kv_dtype_check(m, o.kv_dtype)) != RLX_OK)
        return rc;
    if (o.n_out_rows && (!o.n_slots || !spec->produce_logits || o.n_out_rows > n_tokens))
        return rlx_error(RLX_E_INVALID,
                         "%u logits rows of %u: picking rows needs n_slots, a logits block and at most "
                         "one pick per row",
                         o.n_out_rows, n_tokens);
    if (o.n_slots && (spec->mtp || spec->emit_hidden))
        return rlx_error(RLX_E_UNSUPPORTED, "a block of several sequences has no MTP layer or hidden output yet");
    const rlx__model_desc *d = &m->desc;
    const rlx_model_config *c = &d->cfg;
    if ((rc = check_spec(c, spec)) != RLX_OK)
        return rc;
    rlx__blk b = {.m = m, .d = d, .seq = -1, .kc_rows = -1, .vc_rows = -1};
    if ((b.rc = rlx_graph_create(&b.g)) != RLX_OK)
        return b.rc;
    rlx__graph_set_weights(b.g, m->weight_owner, m->quantized ? 0 : RLX_WEIGHT_FILE_BACKED | RLX_WEIGHT_READ_ONLY);
    memset(io, 0, sizeof *io);
    io->hidden = io->hidden_input = -1;
    io->n_layers = spec->layer_end - spec->layer_start;
    int64_t t = n_tokens, hidden = c->hidden_size;
    int x;
    if (spec->embed_input) {
        io->input = rlx__blk_input(&b, RLX_ROLE_INPUT, "tokens", RLX_DTYPE_I32, 1, &t);
        x = rlx__blk_node2(&b, RLX_OP_EMBED, "embed", io->input, rlx__blk_weight(&b, RLX__R_TOKEN_EMBD, -1), NULL);
    } else {
        io->input = rlx__blk_input(&b, RLX_ROLE_INPUT, "hidden_in", RLX_DTYPE_F32, 2, (int64_t[]){t, hidden});
        x = io->input;
    }
    if (spec->mtp) {
        io->hidden_input = rlx__blk_input(&b, RLX_ROLE_INPUT, "hidden_in", RLX_DTYPE_F32, 2, (int64_t[]){t, hidden});
        x = mtp_input(&b, spec->layer_start, x, io->hidden_input);
    }
    io->positions = b.pos = rlx__blk_input(&b, RLX_ROLE_INPUT, "positions", RLX_DTYPE_I32, 1, &t);
    if (o.n_slots)
        bio->seq = b.seq = rlx__blk_input(&b, RLX_ROLE_INPUT, "slots", RLX_DTYPE_I32, 1, &t);
    for (uint32_t l = spec->layer_start; b.rc == RLX_OK && l < spec->layer_end; l++) {
        const rlx__blk_layer layer = spec->mtp ? mtp_layer(d, l) : model_layer(d, l);
        /* per slot: [slots, ...] with n_slots, else the one sequence's shape */
        int64_t shape[2][4];
        uint32_t dims[2];
        layer_state_shapes(d, layer.kind.linear ? l : UINT32_MAX, kv_capacity, shape[0] + 1, shape[1] + 1, dims);
        shape[0][0] = shape[1][0] = o.n_slots;
        const int off = o.n_slots ? 0 : 1, extra = o.n_slots ? 1 : 0;
        const rlx_dtype dtype = layer.kind.linear ? RLX_DTYPE_F32 : (rlx_dtype)o.kv_dtype;
        char kname[64], vname[64];
        snprintf(kname, sizeof kname, "%s%s", layer.nodes, layer.kind.linear ? "conv_state" : "k_cache");
        snprintf(vname, sizeof vname, "%s%s", layer.nodes, layer.kind.linear ? "ssm_state" : "v_cache");
        b.kc = rlx__blk_input(&b, RLX_ROLE_STATE, kname, dtype, dims[0] + extra, shape[0] + off);
        b.vc = rlx__blk_input(&b, RLX_ROLE_STATE, vname, dtype, dims[1] + extra, shape[1] + off);
        io->k_cache[l - spec->layer_start] = b.kc;
        io->v_cache[l - spec->layer_start] = b.vc;
        if (rows && layer.kind.linear) {
            /* [n_tokens, the one sequence's state shape] */
            shape[0][0] = shape[1][0] = n_tokens;
            snprintf(kname, sizeof kname, "%sconv_state_rows", layer.nodes);
            snprintf(vname, sizeof vname, "%sssm_state_rows", layer.nodes);
            b.kc_rows = rlx__blk_input(&b, RLX_ROLE_STATE, kname, RLX_DTYPE_F32, dims[0] + 1, shape[0]);
            b.vc_rows = rlx__blk_input(&b, RLX_ROLE_STATE, vname, RLX_DTYPE_F32, dims[1] + 1, shape[1]);
        } else {
            b.kc_rows = b.vc_rows = -1;
        }
        if (rows) {
            rows->k_rows[l - spec->layer_start] = b.kc_rows;
            rows->v_rows[l - spec->layer_start] = b.vc_rows;
        }
        if (b.rc != RLX_OK) /* an input above failed (each adds nothing after a failure) */
            break;
        b.layer = &layer;
        x = d->arch->build_layer(&b, x);
        b.layer = NULL;
    }
    if (spec->produce_logits) {
        if (spec->emit_hidden) {
            /* the norm is per row, so norming every row before picking the last changes nothing */
            x = final_norm(&b, spec, x);
            io->hidden = x;
            if (b.rc == RLX_OK)
                b.rc = rlx_graph_mark_output(b.g, x);
            if (!spec->all_logits)
                x = rlx__blk_node(&b, RLX_OP_GATHER_LAST, "last_position", &x, 1, NULL);
        } else if (o.n_out_rows) {
            int64_t r = o.n_out_rows;
            bio->out_rows = rlx__blk_input(&b, RLX_ROLE_INPUT, "logits_rows", RLX_DTYPE_I32, 1, &r);
            x = rlx__blk_node2(&b, RLX_OP_GATHER_ROWS, "logits_rows", x, bio->out_rows, NULL);
            x = final_norm(&b, spec, x);
        } else {
            if (!spec->all_logits)
                x = rlx__blk_node(&b, RLX_OP_GATHER_LAST, "last_position", &x, 1, NULL);
            x = final_norm(&b, spec, x);
        }
        const rlx__role head = c->tie_word_embeddings ? RLX__R_TOKEN_EMBD : RLX__R_OUTPUT;
        x = rlx__blk_node2(&b, RLX_OP_MATMUL, "lm_head", x, rlx__blk_weight(&b, head, -1), NULL);
    }
    io->output = x;
    if (b.rc == RLX_OK)
        b.rc = rlx_graph_mark_output(b.g, x);
    if (b.rc != RLX_OK) {
        rlx_graph_destroy(b.g);
        return b.rc;
    }
    *graph = b.g;
    return RLX_OK;
}
