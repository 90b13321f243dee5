/* GGUF v3 output (rlx_model_write_gguf): llama.cpp's tensor names (the inverse of gguf_model.c's
 * table), hyperparameters and tokenizer metadata, and the tensors converted row by row.
 *
 * The header (metadata and tensor infos) is assembled in memory; the tensor data is then streamed
 * one row at a time from the source mapping through an F32 row buffer into the file, so memory
 * stays at a row or two whatever the model's size. The file is written as OUT.tmp and renamed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "arch.h"
#include "model_internal.h"
#include "quantize.h"
#include "rlx/quant_iface.h"
#include "text/tokenizer_export.h"
#include "util/alloc.h"
#include "util/json.h"

#define ALIGNMENT 32

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
    int failed;
    uint64_t n_kv; /* metadata pairs written (key() counts them) */
} buf;

static void put(buf *b, const void *data, size_t n) {
    if (b->failed || n == 0)
        return; /* nothing to copy (data may be a failed buffer's NULL) */
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *p = rlx__realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void key(buf *b, const char *k, uint32_t type) {
    b->n_kv++;
    put_str(b, k, strlen(k));
    put_u32(b, type);
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    key(b, k, RLX_GGUF_U32);
    put_u32(b, v);
}
static void kv_f32(buf *b, const char *k, float v) {
    key(b, k, RLX_GGUF_F32);
    put(b, &v, 4);
}
static void kv_str(buf *b, const char *k, const char *v) {
    key(b, k, RLX_GGUF_STRING);
    put_str(b, v, strlen(v));
}
static void kv_arch_u32(buf *b, const char *arch, const char *name, int64_t v) {
    char k[96];
    snprintf(k, sizeof k, "%s.%s", arch, name);
    kv_u32(b, k, (uint32_t)v);
}

/* One output tensor: its sources (one, or one per expert of a stacked tensor). */
typedef struct out_tensor {
    char name[96];
    int layer, part;
    const rlx_weight **src;
    int64_t n_src;
    uint32_t n_dims;
    int64_t ne[4];
    uint32_t dtype;
    int fallback;
    size_t nbytes, offset;
    int64_t head_rows; /* > 0: a q or k tensor written in llama.cpp's permuted row order */
    /* > 0: src[0] and src[1] interleaved in runs of this many rows, as llama.cpp fuses them (each
     * head's query then its output gate; each key head's b rows then its a rows) */
    int64_t fuse_rows;
    /* > 0: the value heads of this many rows (or columns, tile_cols) each, from tile_at on,
     * reordered from Hugging Face's grouped order into llama.cpp's tiled one (rlx__gdn.tiled) */
    int64_t tile_head, tile_at;
    int64_t tile_groups, tile_per; /* key heads, and value heads per key head */
    int tile_cols;
} out_tensor;

static int cmp_out(const void *x, const void *y) {
    const out_tensor *a = x, *b = y;
    if (a->layer != b->layer)
        return a->layer < b->layer ? -1 : 1;
    return (a->part > b->part) - (a->part < b->part);
}

static uint32_t ggml_type(uint32_t dtype) {
    static const uint32_t map[RLX_DTYPE_COUNT] = {
        [RLX_DTYPE_F32] = 0,   [RLX_DTYPE_BF16] = 30, [RLX_DTYPE_F16] = 1,   [RLX_DTYPE_Q4_0] = 2,
        [RLX_DTYPE_Q4_1] = 3,  [RLX_DTYPE_Q5_0] = 6,  [RLX_DTYPE_Q5_1] = 7,  [RLX_DTYPE_Q8_0] = 8,
        [RLX_DTYPE_Q4_K] = 12, [RLX_DTYPE_Q5_K] = 13, [RLX_DTYPE_Q6_K] = 14,
    };
    return dtype < RLX_DTYPE_COUNT ? map[dtype] : 0;
}

/* The rows of each head of a q or k tensor (role) when the architecture's GGUF files hold them
 * permuted (arch.h, gguf_qk_permuted), else 0. */
static int64_t permuted_head_rows(const rlx__model_desc *d, rlx__role role) {
    if (!d->arch->gguf_qk_permuted)
        return 0;
    if (role == RLX__R_ATTN_Q || role == RLX__R_ATTN_Q_BIAS || role == RLX__R_ATTN_K || role == RLX__R_ATTN_K_BIAS)
        return d->cfg.head_dim;
    return 0;
}

/* What llama.cpp's converter does to the hybrids (Gated DeltaNet and gated attention layers)
 * beyond the table's names: the value-head order, Qwen3-Next's fused ssm_ba, the M-RoPE sections
 * key. Every hybrid has its q and gate rows fused into attn_q and its MTP layer as the nextn
 * block after the model's own. */
typedef struct hybrid_writer {
    const rlx__arch *arch;
    uint8_t tiled;    /* value heads in tiled order (qwen35, qwen35moe) */
    uint8_t fused_ba; /* in_proj_b and in_proj_a as one ssm_ba, grouped per key head (qwen3next) */
    uint8_t mrope;    /* writes rope.dimension_sections (the qwen35 loaders require it) */
} hybrid_writer;

static const hybrid_writer hybrids[] = {
    {&rlx__arch_qwen3_5, 1, 0, 1},
    {&rlx__arch_qwen3_5_moe, 1, 0, 1},
    {&rlx__arch_qwen3_next, 0, 1, 0},
};

static const hybrid_writer *hybrid_of(const rlx__model_desc *d) {
    for (size_t i = 0; i < sizeof hybrids / sizeof hybrids[0]; i++)
        if (hybrids[i].arch == d->arch)
            return &hybrids[i];
    return NULL;
}

/* The MTP layer's tensors besides its decoder layer, and llama.cpp's nextn names for them. */
#define N_NEXTN 4
/* The table row given a nextn tensor's place (placed.part): past any table's rows, so the
 * block's nextn tensors sort after its decoder layer's */
#define NEXTN_PART 1000
static const char *mtp_pattern(const rlx__mtp_names *mtp, int k) {
    const char *const p[N_NEXTN] = {mtp->proj, mtp->token_norm, mtp->hidden_norm, mtp->final_norm};
    return p[k];
}
static const char *const nextn_names[N_NEXTN] = {"eh_proj.weight", "enorm.weight", "hnorm.weight",
                                                 "shared_head_norm.weight"};

/* A tensor's place in the output: llama.cpp's name, its layer (-1 top level), its table row (or
 * past the table for a nextn tensor), its expert (-1 none) and the Hugging Face prefix of its
 * layer, for finding the other experts and the tensors fused with it. */
typedef struct placed {
    char name[96], prefix[48];
    int layer, part;
    int64_t expert;
} placed;

/* Where Hugging Face tensor hf goes; 0 for a tensor the file has no place for. A hybrid's MTP
 * layer (with n_nextn 1) is block num_hidden_layers: its decoder layer by the table, the rest by
 * nextn_names. */
static int place(const rlx__model_desc *d, int n_nextn, const char *hf, placed *p) {
    const int n = (int)d->cfg.num_hidden_layers;
    p->expert = -1;
    if (n_nextn) {
        const rlx__mtp_names *mtp = rlx__arch_mtp(d->arch);
        char layer[48], name[160];
        if (rlx__mtp_name(mtp->layer, 0, layer, sizeof layer) && strncmp(hf, layer, strlen(layer)) == 0) {
            snprintf(p->prefix, sizeof p->prefix, "%s", layer);
            snprintf(name, sizeof name, "model.layers.%d.%s", n, hf + strlen(layer));
            return rlx__arch_gguf_of_hf(d->arch, name, p->name, sizeof p->name, &p->layer, &p->part, &p->expert);
        }
        for (int k = 0; k < N_NEXTN; k++) {
            if (!rlx__mtp_name(mtp_pattern(mtp, k), 0, name, sizeof name) || strcmp(hf, name) != 0)
                continue;
            snprintf(p->name, sizeof p->name, "blk.%d.nextn.%s", n, nextn_names[k]);
            p->layer = n;
            p->part = NEXTN_PART + k;
            return 1;
        }
    }
    if (!rlx__arch_gguf_of_hf(d->arch, hf, p->name, sizeof p->name, &p->layer, &p->part, &p->expert))
        return 0;
    snprintf(p->prefix, sizeof p->prefix, "model.layers.%d.", p->layer);
    return 1;
}

/* The tensor of role under a layer's Hugging Face prefix, or NULL. */
static const rlx_weight *find_role(const rlx_weights *w, const rlx__model_desc *d, rlx__role role, const char *prefix) {
    const rlx__tensor *t = rlx__arch_tensor(d->arch, role);
    char hf[200];
    if (!t)
        return NULL;
    rlx__tensor_hf_name(t, prefix, -1, hf, sizeof hf);
    return rlx_weights_find(w, hf);
}

/* How a hybrid's tensor o (of role) is assembled: the gate rows fused into attn_q, b and a into
 * ssm_ba, the value heads tiled. Returns 0 for a tensor written with another (the gate, a), 1
 * when o is ready, or a negative status. */
static int hybrid_tensor(const rlx_weights *w, const rlx__model_desc *d, const hybrid_writer *hw, rlx__role role,
                         const placed *p, out_tensor *o) {
    const rlx__gdn *g = &d->gdn;
    const rlx_weight *x = o->src[0], *other = NULL;
    if (role == RLX__R_ATTN_GATE || (hw->fused_ba && role == RLX__R_SSM_ALPHA))
        return 0;
    if (role == RLX__R_ATTN_Q && d->attn_gate) {
        other = find_role(w, d, RLX__R_ATTN_GATE, p->prefix);
        o->fuse_rows = d->cfg.head_dim;
    } else if (role == RLX__R_SSM_BETA && hw->fused_ba) {
        other = find_role(w, d, RLX__R_SSM_ALPHA, p->prefix);
        o->fuse_rows = g->v_heads / g->k_heads;
        snprintf(o->name, sizeof o->name, "blk.%d.ssm_ba.weight", p->layer);
    }
    if (o->fuse_rows) {
        if (!other || other->dtype != x->dtype || other->n_dims != 2 || x->n_dims != 2 ||
            memcmp(other->shape, x->shape, sizeof x->shape) != 0 || x->shape[0] % o->fuse_rows != 0)
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' has no partner of its shape and type to be written with",
                             x->file, x->name);
        o->src[1] = other;
        o->n_src = 2;
        o->ne[1] = 2 * x->shape[0];
    }
    if (!hw->tiled || g->tiled || g->k_heads == g->v_heads)
        return 1; /* already in llama.cpp's order, or the orders agree */
    o->tile_groups = g->k_heads;
    o->tile_per = g->v_heads / g->k_heads;
    const int64_t qk = 2 * g->k_heads * g->k_dim;
    switch (role) {
    case RLX__R_SSM_QKV:
    case RLX__R_SSM_CONV:
        o->tile_at = qk;
        o->tile_head = g->v_dim;
        break;
    case RLX__R_SSM_Z:
        o->tile_head = g->v_dim;
        break;
    case RLX__R_SSM_BETA:
    case RLX__R_SSM_ALPHA:
    case RLX__R_SSM_A:
    case RLX__R_SSM_DT:
        o->tile_head = 1;
        break;
    case RLX__R_SSM_OUT:
        o->tile_head = g->v_dim;
        o->tile_cols = 1;
        break;
    default:
        return 1;
    }
    const int64_t span = o->tile_cols || o->n_dims == 1 ? o->ne[0] : o->ne[1];
    if (span != o->tile_at + g->v_heads * o->tile_head)
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' does not hold %lld value heads of %lld after %lld rows",
                         x->file, x->name, (long long)g->v_heads, (long long)o->tile_head, (long long)o->tile_at);
    return 1;
}

/* The tensors of the model under llama.cpp's names, expert views stacked, in converter order;
 * rope_freqs (the description's RoPE factors, as rope, F32) first, as llama.cpp's converter
 * writes it; a hybrid's (hw) as hybrid_tensor assembles them, its MTP layer when n_nextn is 1. */
static rlx_status collect(const rlx_weights *w, const rlx__model_desc *desc, const hybrid_writer *hw, int n_nextn,
                          const rlx_weight *rope, const rlx__qtype *q, out_tensor **out, size_t *n_out) {
    const rlx_model_config *c = &desc->cfg;
    const size_t n = rlx_weights_count(w);
    out_tensor *t = rlx__calloc(n + 1, sizeof *t);
    if (!t)
        return rlx_error(RLX_E_NOMEM, "out of memory");
    size_t k = 0;
    rlx_status st = RLX_OK;
    if (rope->data) {
        out_tensor *o = &t[k++];
        snprintf(o->name, sizeof o->name, "rope_freqs.weight");
        o->layer = o->part = -1;
        o->n_src = 1;
        if (!(o->src = rlx__calloc(1, sizeof *o->src)))
            st = rlx_error(RLX_E_NOMEM, "out of memory");
        else
            o->src[0] = rope;
        o->n_dims = 1;
        o->ne[0] = rope->shape[0];
        o->dtype = RLX_DTYPE_F32;
        o->nbytes = rope->nbytes;
    }
    for (size_t i = 0; i < n && st == RLX_OK; i++) {
        const rlx_weight *x = rlx_weights_at(w, i);
        placed p;
        if (!place(desc, n_nextn, x->name, &p))
            continue; /* MTP heads and other tensors the architecture has no GGUF name for */
        if (p.expert > 0)
            continue; /* gathered with expert 0 */
        out_tensor *o = &t[k++];
        snprintf(o->name, sizeof o->name, "%s", p.name);
        o->layer = p.layer;
        o->part = p.part;
        const int in_table = p.part < NEXTN_PART;
        o->head_rows = in_table ? permuted_head_rows(desc, desc->arch->tensors[p.part].role) : 0;
        o->n_src = p.expert == 0 ? c->num_experts : 1;
        if (!(o->src = rlx__calloc((size_t)(o->n_src > 2 ? o->n_src : 2), sizeof *o->src))) {
            st = rlx_error(RLX_E_NOMEM, "out of memory");
            break;
        }
        o->src[0] = x;
        for (int64_t e = 1; e < o->n_src && st == RLX_OK; e++) {
            char hf[160];
            rlx__tensor_hf_name(&desc->arch->tensors[p.part], p.prefix, e, hf, sizeof hf);
            if (!(o->src[e] = rlx_weights_find(w, hf)) || o->src[e]->n_dims != x->n_dims ||
                memcmp(o->src[e]->shape, x->shape, sizeof x->shape) != 0)
                st = rlx_error(RLX_E_FORMAT, "%s: expert tensor '%s' is missing or shaped unlike expert 0's", x->file,
                               hf);
        }
        if (st != RLX_OK)
            break;
        o->n_dims = x->n_dims + (p.expert == 0);
        for (uint32_t dim = 0; dim < x->n_dims; dim++)
            o->ne[dim] = x->shape[x->n_dims - 1 - dim];
        if (p.expert == 0)
            o->ne[x->n_dims] = o->n_src;
        if (hw && in_table) {
            const int ready = hybrid_tensor(w, desc, hw, desc->arch->tensors[p.part].role, &p, o);
            if (ready < 0) {
                st = ready;
                break;
            }
            if (!ready) { /* written as part of another tensor */
                free(o->src);
                memset(o, 0, sizeof *o);
                k--;
                continue;
            }
        }
        /* llama-quantize counts the nextn block among the layers */
        const rlx__qtensor qt = {
            o->name, o->n_dims, o->ne[0], c->num_hidden_layers + n_nextn, c->num_experts, c->tie_word_embeddings};
        o->dtype = rlx__qtype_tensor(q, &qt, &o->fallback);
        int64_t rows = 1;
        for (uint32_t dim = 1; dim < o->n_dims; dim++)
            rows *= o->ne[dim];
        o->nbytes = (size_t)rows * rlx_iface_row_bytes(o->dtype, o->ne[0]);
    }
    qsort(t, k, sizeof *t, cmp_out);
    *out = t;
    *n_out = k;
    return st;
}

/* general.name: the source's own, else the directory's or file's base name. */
static void model_name(const rlx_model *m, char *out, size_t len) {
    const rlx__gguf *g = rlx__weights_gguf(rlx_model_weights(m));
    rlx__gguf_str s;
    if (g && rlx__gguf_string(g, "general.name", 1, &s) == RLX_OK) {
        snprintf(out, len, "%.*s", (int)(s.len < len ? s.len : len - 1), s.s);
        return;
    }
    const char *dir = rlx_model_dir(m);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    size_t stem = n - start;
    if (stem > 5 && strncmp(dir + n - 5, ".gguf", 5) == 0)
        stem -= 5;
    snprintf(out, len, "%.*s", (int)stem, dir + start);
}

static rlx_status tokenizer_kv(buf *b, const rlx_tokenizer *tok, int64_t n_vocab, const rlx_model_config *c) {
    rlx__tokenizer_gguf_kind kind;
    rlx_status st = rlx__tokenizer_gguf(tok, &kind);
    if (st != RLX_OK)
        return st;
    const int spm = strcmp(kind.model, "llama") == 0;
    kv_str(b, "tokenizer.ggml.model", kind.model);
    kv_str(b, "tokenizer.ggml.pre", spm ? "default" : kind.pre);
    if (spm) {
        key(b, "tokenizer.ggml.add_space_prefix", RLX_GGUF_BOOL);
        put(b, &(uint8_t){(uint8_t)kind.add_space_prefix}, 1);
    }
    key(b, "tokenizer.ggml.tokens", RLX_GGUF_ARRAY);
    put_u32(b, RLX_GGUF_STRING);
    put_u64(b, (uint64_t)n_vocab);
    for (int64_t id = 0; id < n_vocab; id++) {
        size_t len;
        int type;
        const char *s = rlx__tokenizer_token(tok, (int32_t)id, &len, &type);
        char pad[32];
        if (!s) {
            len = (size_t)snprintf(pad, sizeof pad, "[PAD%lld]", (long long)id);
            s = pad;
        }
        put_str(b, s, len);
    }
    if (spm) { /* SentencePiece merges by score, and a 'llama' vocabulary has no merges */
        float *scores;
        if ((st = rlx__tokenizer_scores(tok, n_vocab, &scores)) != RLX_OK)
            return st;
        key(b, "tokenizer.ggml.scores", RLX_GGUF_ARRAY);
        put_u32(b, RLX_GGUF_F32);
        put_u64(b, (uint64_t)n_vocab);
        put(b, scores, (size_t)n_vocab * sizeof *scores);
        free(scores);
    }
    key(b, "tokenizer.ggml.token_type", RLX_GGUF_ARRAY);
    put_u32(b, RLX_GGUF_I32);
    put_u64(b, (uint64_t)n_vocab);
    for (int64_t id = 0; id < n_vocab; id++) {
        size_t len;
        int type = 5;
        if (!rlx__tokenizer_token(tok, (int32_t)id, &len, &type))
            type = 5; /* unused */
        put_u32(b, (uint32_t)type);
    }
    int32_t *pairs = NULL;
    size_t n_merges = 0;
    if (!spm) {
        if ((st = rlx__tokenizer_merges(tok, &pairs, &n_merges)) != RLX_OK)
            return st;
        key(b, "tokenizer.ggml.merges", RLX_GGUF_ARRAY);
        put_u32(b, RLX_GGUF_STRING);
        put_u64(b, n_merges);
        for (size_t i = 0; i < n_merges; i++) {
            size_t la, lb;
            int ta, tb;
            const char *a = rlx__tokenizer_token(tok, pairs[2 * i], &la, &ta);
            const char *z = rlx__tokenizer_token(tok, pairs[2 * i + 1], &lb, &tb);
            put_u64(b, la + 1 + lb);
            put(b, a, la);
            put(b, " ", 1);
            put(b, z, lb);
        }
        free(pairs);
    }
    int32_t eos = rlx_tokenizer_eos_id(tok);
    if (eos < 0 && c->n_eos)
        eos = c->eos_ids[0];
    if (eos >= 0)
        kv_u32(b, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    const int32_t pad = rlx_tokenizer_pad_id(tok) >= 0 ? rlx_tokenizer_pad_id(tok) : eos;
    if (pad >= 0)
        kv_u32(b, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    const int32_t bos = rlx_tokenizer_bos_id(tok);
    if (bos >= 0)
        kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    key(b, "tokenizer.ggml.add_bos_token", RLX_GGUF_BOOL);
    put(b, &(uint8_t){(uint8_t)kind.add_bos}, 1);
    if (kind.add_eos) {
        key(b, "tokenizer.ggml.add_eos_token", RLX_GGUF_BOOL);
        put(b, &(uint8_t){1}, 1);
    }
    const char *tmpl = rlx__tokenizer_chat_template(tok);
    if (tmpl)
        kv_str(b, "tokenizer.chat_template", tmpl);
    return RLX_OK;
}

/* The Hugging Face position of position i of o's tiled value heads: tiled head j * k_heads + h
 * is Hugging Face's head h * (v_heads / k_heads) + j, the j-th value head of key head h. */
static int64_t tiled_source(const out_tensor *o, int64_t i) {
    const int64_t head = i / o->tile_head, within = i % o->tile_head;
    return ((head % o->tile_groups) * o->tile_per + head / o->tile_groups) * o->tile_head + within;
}

/* The source and source row of output row r of o (the fused, expert and head orders undone). */
static void source_row(const out_tensor *o, int64_t r, int64_t src_rows, int64_t *s, int64_t *row) {
    if (o->fuse_rows) {
        *s = (r / o->fuse_rows) % 2;
        *row = r / (2 * o->fuse_rows) * o->fuse_rows + r % o->fuse_rows;
    } else {
        *s = r / src_rows;
        *row = r % src_rows;
    }
    if (o->head_rows)
        *row = rlx__qk_hf_row(*row, o->head_rows);
    if (o->tile_head && !o->tile_cols && *row >= o->tile_at)
        *row = o->tile_at + tiled_source(o, *row - o->tile_at);
}

/* Writes the data of tensor o at the file's position: row by row through F32 (a permuted or
 * reordered vector value by value, each value a row of the reordering; a tensor whose columns
 * are reordered through F32 always). */
static rlx_status write_tensor(FILE *f, const char *path, const out_tensor *o, float *row, float *moved,
                               uint8_t *qrow) {
    const int by_value = o->n_dims == 1 && (o->head_rows || o->tile_head);
    const int64_t cols = by_value ? 1 : o->ne[0];
    const size_t out_row = rlx_iface_row_bytes(o->dtype, cols);
    int64_t rows = by_value ? o->ne[0] : 1;
    for (uint32_t dim = 1; !by_value && dim < o->n_dims; dim++)
        rows *= o->ne[dim];
    const int64_t src_rows = o->n_src ? rows / o->n_src : 0; /* no experts: no rows */
    for (int64_t r = 0; r < rows; r++) {
        int64_t s, from;
        source_row(o, r, src_rows, &s, &from);
        const rlx_weight *x = o->src[s];
        const size_t in_row = rlx_iface_row_bytes(x->dtype, cols);
        if (!in_row || (size_t)(from + 1) * in_row > x->nbytes)
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' is shorter than its shape says", x->file, x->name);
        const uint8_t *src = (const uint8_t *)x->data + (size_t)from * in_row;
        const void *bytes = src;
        if (x->dtype != o->dtype || o->tile_cols) {
            if (rlx_iface_dequant_row(x->dtype, src, row, cols) != 0)
                return rlx_error(RLX_E_UNSUPPORTED, "%s: cannot read tensor '%s' of %s", path, o->name,
                                 rlx_dtype_name((int)x->dtype));
            const float *values = row;
            if (o->tile_cols) {
                for (int64_t j = 0; j < cols; j++)
                    moved[j] = row[j < o->tile_at ? j : o->tile_at + tiled_source(o, j - o->tile_at)];
                values = moved;
            }
            if (rlx__quantize_row(o->dtype, values, qrow, cols) != 0)
                return rlx_error(RLX_E_UNSUPPORTED, "%s: cannot convert tensor '%s' from %s to %s", path, o->name,
                                 rlx_dtype_name((int)x->dtype), rlx_dtype_name((int)o->dtype));
            bytes = qrow;
        }
        if (fwrite(bytes, 1, out_row, f) != out_row)
            return rlx_error(RLX_E_IO, "%s: writing tensor '%s': %s", path, o->name, strerror(errno));
    }
    return RLX_OK;
}

/* The general.architecture a model is written as. */
static const char *gguf_arch(const rlx__model_desc *d) {
    return d->arch->gguf_write_arch ? d->arch->gguf_write_arch : d->arch->gguf_archs[0];
}

/* Whether a hybrid mixture-of-experts model states a dense MLP size. Qwen3.5-MoE configs have
 * none, and the converter writes feed_forward_length only from a config that has one; for a GGUF
 * source rlx fills the size in from the experts', so the source's own key decides. */
static int source_has_ff(const rlx_model *m, const char *arch) {
    const rlx__gguf *g = rlx__weights_gguf(rlx_model_weights(m));
    if (!g)
        return rlx_model_config_of(m)->intermediate_size > 0;
    char k[96];
    snprintf(k, sizeof k, "%s.feed_forward_length", arch);
    return rlx__gguf_find(g, k) != NULL;
}

/* llama.cpp's M-RoPE sections: time, height, width and a fourth it pads with 0. */
#define MROPE_SECTIONS 4

/* The model's M-RoPE sections (config.json's rope_parameters.mrope_section, or rope_scaling's in
 * older configs, in text_config when there is one; a GGUF source's rope.dimension_sections),
 * padded with zeros or cut to MROPE_SECTIONS as the converter does, else the converter's default
 * [11, 11, 10, 0]. A text position is the same in every section, so rlx does not use them: they
 * are carried for llama.cpp, whose qwen35 loaders require the key. */
static rlx_status mrope_sections(const rlx_model *m, const char *arch, int32_t out[MROPE_SECTIONS]) {
    static const int32_t dflt[MROPE_SECTIONS] = {11, 11, 10, 0};
    memcpy(out, dflt, sizeof dflt);
    const rlx__gguf *g = rlx__weights_gguf(rlx_model_weights(m));
    if (g) {
        char k[96];
        snprintf(k, sizeof k, "%s.rope.dimension_sections", arch);
        const rlx__gguf_kv *kv;
        rlx_status st = rlx__gguf_array(g, k, RLX_GGUF_I64, 1, &kv);
        if (st != RLX_OK)
            return st == RLX_E_NOT_FOUND ? RLX_OK : st;
        for (uint64_t i = 0; i < MROPE_SECTIONS; i++) {
            const int64_t v = i < kv->v.arr.n ? rlx__gguf_array_int(kv, i) : 0;
            if (v < 0 || v > INT32_MAX)
                return rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' holds %lld, not a section size", rlx_model_dir(m),
                                 k, (long long)v);
            out[i] = (int32_t)v;
        }
        return RLX_OK;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", rlx_model_dir(m)) >= (int)sizeof path)
        return rlx_error(RLX_E_INVALID, "%s: path too long", rlx_model_dir(m));
    cJSON *root;
    rlx_status st = rlx__json_load(path, 1, &root);
    if (st != RLX_OK || !root)
        return st;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(tc))
        tc = root;
    const cJSON *sec = NULL;
    static const char *const holders[] = {"rope_parameters", "rope_scaling"};
    for (size_t h = 0; !sec && h < sizeof holders / sizeof holders[0]; h++) {
        const cJSON *obj = cJSON_GetObjectItemCaseSensitive(tc, holders[h]);
        if (cJSON_IsObject(obj))
            sec = cJSON_GetObjectItemCaseSensitive(obj, "mrope_section");
    }
    if (sec && !cJSON_IsNull(sec)) {
        if (!cJSON_IsArray(sec))
            st = rlx__hf_wrong_type(path, "mrope_section", "a list of section sizes", sec);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, sec) {
            int64_t v;
            if (st != RLX_OK)
                break;
            if (!rlx__json_int(e, &v) || v < 0 || v > INT32_MAX)
                st = rlx__hf_wrong_type(path, "mrope_section", "a list of section sizes", sec);
            else if (i < MROPE_SECTIONS)
                out[i++] = (int32_t)v;
        }
        while (st == RLX_OK && i < MROPE_SECTIONS)
            out[i++] = 0;
    }
    cJSON_Delete(root);
    return st;
}

/* llama.cpp's full_attention_interval: layer i is full attention when (i + 1) % interval is 0,
 * which must be the model's pattern (a layer_types list can say others, which the file cannot);
 * 0 when it is not. */
static int64_t attention_interval(const rlx__model_desc *d) {
    const int64_t n = d->cfg.num_hidden_layers;
    int64_t k = n + 1; /* no full-attention layer at all */
    for (int64_t i = 0; i < n; i++)
        if (!d->layers[i].linear) {
            k = i + 1;
            break;
        }
    for (int64_t i = 0; i < n; i++)
        if (d->layers[i].linear != ((i + 1) % k != 0))
            return 0;
    return k;
}

/* The keys llama.cpp's converter writes for a hybrid beyond the common ones (its Qwen3NextModel's
 * and, for qwen35 and qwen35moe, the M-RoPE sections). */
static rlx_status hybrid_kv(buf *b, const rlx_model *m, const hybrid_writer *hw, int n_nextn) {
    const rlx__model_desc *d = rlx__model_desc_of(m);
    const rlx__gdn *g = &d->gdn;
    const char *arch = gguf_arch(d);
    const int64_t interval = attention_interval(d);
    if (!interval)
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: the full-attention layers are not every n-th layer, the only pattern llama.cpp's %s "
                         "states (full_attention_interval)",
                         rlx_model_dir(m), arch);
    if (d->shexp_ff)
        kv_arch_u32(b, arch, "expert_shared_feed_forward_length", d->shexp_ff);
    if (n_nextn)
        kv_arch_u32(b, arch, "nextn_predict_layers", n_nextn);
    kv_arch_u32(b, arch, "ssm.conv_kernel", g->conv_kernel);
    kv_arch_u32(b, arch, "ssm.state_size", g->k_dim);
    kv_arch_u32(b, arch, "ssm.group_count", g->k_heads);
    kv_arch_u32(b, arch, "ssm.time_step_rank", g->v_heads);
    kv_arch_u32(b, arch, "ssm.inner_size", g->v_heads * g->v_dim);
    kv_arch_u32(b, arch, "full_attention_interval", interval);
    kv_arch_u32(b, arch, "rope.dimension_count", d->rope_dims ? d->rope_dims : d->cfg.head_dim);
    if (!hw->mrope)
        return RLX_OK;
    int32_t sections[MROPE_SECTIONS];
    rlx_status st = mrope_sections(m, arch, sections);
    if (st != RLX_OK)
        return st;
    char k[96];
    snprintf(k, sizeof k, "%s.rope.dimension_sections", arch);
    key(b, k, RLX_GGUF_ARRAY);
    put_u32(b, RLX_GGUF_I32);
    put_u64(b, MROPE_SECTIONS);
    put(b, sections, sizeof sections);
    return RLX_OK;
}

static rlx_status write_file(const rlx_model *m, const rlx_tokenizer *tok, const char *tmp, const rlx__qtype *q,
                             const hybrid_writer *hw, int n_nextn, out_tensor *t, size_t n,
                             rlx_quantize_progress progress, void *ctx) {
    const rlx_model_config *c = rlx_model_config_of(m);
    const rlx__model_desc *d = rlx__model_desc_of(m);
    const int moe = c->num_experts > 0;
    const char *arch = gguf_arch(d);
    char name[256];
    model_name(m, name, sizeof name);
    int64_t n_vocab = c->vocab_size;
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, "token_embd.weight") == 0)
            n_vocab = t[i].ne[1];

    buf kv = {0};
    kv_str(&kv, "general.architecture", arch);
    kv_str(&kv, "general.type", "model");
    kv_str(&kv, "general.name", name);
    kv_arch_u32(&kv, arch, "context_length", c->max_position_embeddings);
    kv_arch_u32(&kv, arch, "embedding_length", c->hidden_size);
    kv_arch_u32(&kv, arch, "block_count", c->num_hidden_layers + n_nextn);
    if (!hw || !moe || source_has_ff(m, arch))
        kv_arch_u32(&kv, arch, "feed_forward_length", c->intermediate_size);
    kv_arch_u32(&kv, arch, "attention.head_count", c->num_attention_heads);
    kv_arch_u32(&kv, arch, "attention.head_count_kv", c->num_key_value_heads);
    char k[96];
    snprintf(k, sizeof k, "%s.rope.freq_base", arch);
    kv_f32(&kv, k, (float)c->rope_theta);
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    kv_f32(&kv, k, (float)c->rms_norm_eps);
    if (moe) {
        kv_arch_u32(&kv, arch, "expert_used_count", c->num_experts_per_tok);
        kv_arch_u32(&kv, arch, "expert_count", c->num_experts);
        kv_arch_u32(&kv, arch, "expert_feed_forward_length", c->moe_intermediate_size);
    }
    kv_arch_u32(&kv, arch, "attention.key_length", c->head_dim);
    kv_arch_u32(&kv, arch, "attention.value_length", c->head_dim);
    rlx_status st = hw ? hybrid_kv(&kv, m, hw, n_nextn) : RLX_OK;
    if (st != RLX_OK) {
        free(kv.p);
        return st;
    }
    if (d->arch->gguf_qk_permuted) { /* what llama.cpp's LlamaModel adds */
        kv_arch_u32(&kv, arch, "vocab_size", c->vocab_size);
        kv_arch_u32(&kv, arch, "rope.dimension_count", c->head_dim);
        if (d->layers[0].window)
            kv_arch_u32(&kv, arch, "attention.sliding_window", d->layers[0].window);
    }
    st = tokenizer_kv(&kv, tok, n_vocab, c);
    if (st != RLX_OK) {
        free(kv.p);
        return st;
    }
    kv_u32(&kv, "general.quantization_version", 2);
    kv_u32(&kv, "general.file_type", q->file_type);
    kv_u32(&kv, "general.alignment", ALIGNMENT);

    buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, n);
    put_u64(&h, kv.n_kv);
    put(&h, kv.p, kv.n);
    const int kv_failed = kv.failed;
    free(kv.p);
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        offset = (offset + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
        t[i].offset = offset;
        offset += t[i].nbytes;
        put_str(&h, t[i].name, strlen(t[i].name));
        put_u32(&h, t[i].n_dims);
        for (uint32_t dim = 0; dim < t[i].n_dims; dim++)
            put_u64(&h, (uint64_t)t[i].ne[dim]);
        put_u32(&h, ggml_type(t[i].dtype));
        put_u64(&h, t[i].offset);
    }
    static const uint8_t zeros[ALIGNMENT] = {0};
    put(&h, zeros, (ALIGNMENT - h.n % ALIGNMENT) % ALIGNMENT);
    if (h.failed || kv_failed) {
        free(h.p);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory for the GGUF header", tmp);
    }

    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(h.p);
        return rlx_error(RLX_E_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    if (fwrite(h.p, 1, h.n, f) != h.n)
        st = rlx_error(RLX_E_IO, "%s: writing the header: %s", tmp, strerror(errno));
    free(h.p);
    int64_t max_cols = 1;
    for (size_t i = 0; i < n; i++)
        max_cols = t[i].ne[0] > max_cols ? t[i].ne[0] : max_cols;
    float *row = rlx__malloc((size_t)max_cols * sizeof *row);
    float *moved = rlx__malloc((size_t)max_cols * sizeof *moved);
    uint8_t *qrow = rlx__malloc((size_t)max_cols * sizeof(float));
    if (st == RLX_OK && (!row || !moved || !qrow))
        st = rlx_error(RLX_E_NOMEM, "%s: out of memory", tmp);
    size_t pos = 0;
    for (size_t i = 0; i < n && st == RLX_OK; i++) {
        if (t[i].offset > pos && fwrite(zeros, 1, t[i].offset - pos, f) != t[i].offset - pos) {
            st = rlx_error(RLX_E_IO, "%s: %s", tmp, strerror(errno));
            break;
        }
        if ((st = write_tensor(f, tmp, &t[i], row, moved, qrow)) != RLX_OK)
            break;
        pos = t[i].offset + t[i].nbytes;
        if (progress) {
            size_t in = 0;
            for (int64_t e = 0; e < t[i].n_src; e++)
                in += t[i].src[e]->nbytes;
            const rlx_quantize_event ev = {t[i].name, t[i].src[0]->dtype, t[i].dtype, t[i].fallback, i, n,
                                           in,        t[i].nbytes};
            progress(ctx, &ev);
        }
    }
    free(row);
    free(moved);
    free(qrow);
    if (fflush(f) != 0 && st == RLX_OK)
        st = rlx_error(RLX_E_IO, "%s: %s", tmp, strerror(errno));
    if (st == RLX_OK && fsync(fileno(f)) != 0)
        st = rlx_error(RLX_E_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && st == RLX_OK)
        st = rlx_error(RLX_E_IO, "%s: %s", tmp, strerror(errno));
    return st;
}

int rlx_quant_type_known(const char *name) { return rlx__qtype_find(name) != NULL; }

rlx_status rlx_model_write_gguf(const rlx_model *m, const rlx_tokenizer *tok, const char *out_path, const char *type,
                                rlx_quantize_progress progress, void *ctx) {
    if (!m || !tok || !out_path || !type)
        return rlx_error(RLX_E_INVALID, "rlx_model_write_gguf: NULL argument");
    const rlx__qtype *q = rlx__qtype_find(type);
    if (!q)
        return rlx_error(RLX_E_INVALID, "unknown quantization type '%s' (one of %s)", type, rlx__qtype_names());
    const rlx_model_config *c = rlx_model_config_of(m);
    if (!*gguf_arch(rlx__model_desc_of(m)))
        return rlx_error(RLX_E_UNSUPPORTED, "%s: rlx cannot write %s models as GGUF yet", rlx_model_dir(m),
                         rlx__model_desc_of(m)->arch->name);
    const rlx__model_desc *d = rlx__model_desc_of(m);
    for (int64_t l = 0; c->num_experts > 0 && l < c->num_hidden_layers; l++)
        if (!rlx_model_config_layer_is_moe(c, l))
            return rlx_error(RLX_E_UNSUPPORTED,
                             "%s: layer %lld has a dense MLP (mlp_only_layers, decoder_sparse_step); llama.cpp's "
                             "%s has experts in every layer",
                             rlx_model_dir(m), (long long)l, gguf_arch(d));
    if (c->num_experts > 0 && !c->norm_topk_prob)
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: norm_topk_prob is false; llama.cpp's %s always renormalises the top-k weights",
                         rlx_model_dir(m), gguf_arch(d));
    /* a llama file says one window for all layers (rlx's own key); the others none */
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        if (d->layers[l].window != (d->arch->gguf_qk_permuted ? d->layers[0].window : 0))
            return rlx_error(RLX_E_UNSUPPORTED, "%s: layer %lld uses a sliding window, which llama.cpp's %s has not",
                             rlx_model_dir(m), (long long)l, gguf_arch(d));
    const int64_t half = c->head_dim / 2;
    const rlx_weight rope = {.name = "rope_freqs",
                             .dtype = RLX_DTYPE_F32,
                             .n_dims = 1,
                             .shape = {half, 1, 1, 1},
                             .data = d->rope_freqs,
                             .nbytes = d->rope_freqs ? (size_t)half * sizeof(float) : 0,
                             .file = rlx_model_dir(m)};
    out_tensor *t = NULL;
    size_t n = 0;
    /* a hybrid's MTP layer, when the model's own weights hold it, is written as the nextn block */
    const hybrid_writer *hw = hybrid_of(d);
    char mtp_proj[160];
    const int n_nextn = hw && rlx__mtp_name(rlx__arch_mtp(d->arch)->proj, 0, mtp_proj, sizeof mtp_proj) &&
                        rlx_weights_find(rlx_model_weights(m), mtp_proj);
    rlx_status st = collect(rlx_model_weights(m), d, hw, n_nextn, &rope, q, &t, &n);
    char *tmp = NULL;
    if (st == RLX_OK && !(tmp = rlx__malloc(strlen(out_path) + 5)))
        st = rlx_error(RLX_E_NOMEM, "out of memory");
    if (st == RLX_OK) {
        sprintf(tmp, "%s.tmp", out_path);
        st = write_file(m, tok, tmp, q, hw, n_nextn, t, n, progress, ctx);
        if (st == RLX_OK && rename(tmp, out_path) != 0)
            st = rlx_error(RLX_E_IO, "%s: cannot rename %s to it: %s", out_path, tmp, strerror(errno));
        if (st != RLX_OK)
            remove(tmp);
    }
    for (size_t i = 0; i < n; i++)
        free(t[i].src);
    free(t);
    free(tmp);
    return st;
}
