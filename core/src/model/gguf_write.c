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

#define ALIGNMENT 32

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
    int failed;
    uint64_t n_kv; /* metadata pairs written (key() counts them) */
} buf;

static void put(buf *b, const void *data, size_t n) {
    if (b->failed)
        return;
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

/* The tensors of the model under llama.cpp's names, expert views stacked, in converter order;
 * rope_freqs (the description's RoPE factors, as rope, F32) first, as llama.cpp's converter
 * writes it. */
static rlx_status collect(const rlx_weights *w, const rlx__model_desc *desc, const rlx_weight *rope,
                          const rlx__qtype *q, out_tensor **out, size_t *n_out) {
    const rlx_model_config *c = &desc->cfg;
    const size_t n = rlx_weights_count(w);
    out_tensor *t = rlx__calloc(n + 1, sizeof *t);
    if (!t)
        return rlx_error(RLX_E_NOMEM, "out of memory");
    size_t k = 0;
    if (rope->data) {
        out_tensor *o = &t[k++];
        snprintf(o->name, sizeof o->name, "rope_freqs.weight");
        o->layer = o->part = -1;
        o->n_src = 1;
        if (!(o->src = rlx__calloc(1, sizeof *o->src))) {
            *out = t;
            *n_out = k;
            return rlx_error(RLX_E_NOMEM, "out of memory");
        }
        o->src[0] = rope;
        o->n_dims = 1;
        o->ne[0] = rope->shape[0];
        o->dtype = RLX_DTYPE_F32;
        o->nbytes = rope->nbytes;
    }
    for (size_t i = 0; i < n; i++) {
        const rlx_weight *x = rlx_weights_at(w, i);
        char name[96];
        int layer, part;
        int64_t expert;
        if (!rlx__arch_gguf_of_hf(desc->arch, x->name, name, sizeof name, &layer, &part, &expert))
            continue; /* MTP heads and other tensors the architecture has no GGUF name for */
        if (expert > 0)
            continue; /* gathered with expert 0 */
        out_tensor *o = &t[k++];
        snprintf(o->name, sizeof o->name, "%s", name);
        o->layer = layer;
        o->part = part;
        o->head_rows = permuted_head_rows(desc, desc->arch->tensors[part].role);
        o->n_src = expert == 0 ? c->num_experts : 1;
        if (!(o->src = rlx__calloc((size_t)o->n_src, sizeof *o->src))) {
            *out = t;
            *n_out = k;
            return rlx_error(RLX_E_NOMEM, "out of memory");
        }
        o->src[0] = x;
        for (int64_t e = 1; e < o->n_src; e++) {
            char hf[160];
            char prefix[32];
            snprintf(prefix, sizeof prefix, "model.layers.%d.", layer);
            rlx__tensor_hf_name(&desc->arch->tensors[part], prefix, e, hf, sizeof hf);
            if (!(o->src[e] = rlx_weights_find(w, hf)) || o->src[e]->n_dims != x->n_dims ||
                memcmp(o->src[e]->shape, x->shape, sizeof x->shape) != 0) {
                *out = t;
                *n_out = k;
                return rlx_error(RLX_E_FORMAT, "%s: expert tensor '%s' is missing or shaped unlike expert 0's", x->file,
                                 hf);
            }
        }
        o->n_dims = x->n_dims + (expert == 0);
        for (uint32_t d = 0; d < x->n_dims; d++)
            o->ne[d] = x->shape[x->n_dims - 1 - d];
        if (expert == 0)
            o->ne[x->n_dims] = o->n_src;
        const rlx__qtensor qt = {
            o->name, o->n_dims, o->ne[0], c->num_hidden_layers, c->num_experts, c->tie_word_embeddings};
        o->dtype = rlx__qtype_tensor(q, &qt, &o->fallback);
        int64_t rows = 1;
        for (uint32_t d = 1; d < o->n_dims; d++)
            rows *= o->ne[d];
        o->nbytes = (size_t)rows * rlx_iface_row_bytes(o->dtype, o->ne[0]);
    }
    qsort(t, k, sizeof *t, cmp_out);
    *out = t;
    *n_out = k;
    return RLX_OK;
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

/* Writes the data of tensor o at the file's position: row by row through F32 (a permuted bias
 * value by value, each value a row of llama.cpp's permutation). */
static rlx_status write_tensor(FILE *f, const char *path, const out_tensor *o, float *row, uint8_t *qrow) {
    const int64_t cols = o->head_rows && o->n_dims == 1 ? 1 : o->ne[0];
    const size_t out_row = rlx_iface_row_bytes(o->dtype, cols);
    for (int64_t e = 0; e < o->n_src; e++) {
        const rlx_weight *x = o->src[e];
        const size_t in_row = rlx_iface_row_bytes(x->dtype, cols);
        const int64_t rows = in_row ? (int64_t)(x->nbytes / in_row) : 0;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t from = o->head_rows ? rlx__qk_hf_row(r, o->head_rows) : r;
            const uint8_t *src = (const uint8_t *)x->data + (size_t)from * in_row;
            const void *bytes = src;
            if (x->dtype != o->dtype) {
                if (rlx_iface_dequant_row(x->dtype, src, row, cols) != 0 ||
                    rlx__quantize_row(o->dtype, row, qrow, cols) != 0)
                    return rlx_error(RLX_E_UNSUPPORTED, "%s: cannot convert tensor '%s' from %s to %s", path, o->name,
                                     rlx_dtype_name((int)x->dtype), rlx_dtype_name((int)o->dtype));
                bytes = qrow;
            }
            if (fwrite(bytes, 1, out_row, f) != out_row)
                return rlx_error(RLX_E_IO, "%s: writing tensor '%s': %s", path, o->name, strerror(errno));
        }
    }
    return RLX_OK;
}

/* The general.architecture a model is written as. */
static const char *gguf_arch(const rlx__model_desc *d) {
    return d->arch->gguf_write_arch ? d->arch->gguf_write_arch : d->arch->gguf_archs[0];
}

static rlx_status write_file(const rlx_model *m, const rlx_tokenizer *tok, const char *tmp, const rlx__qtype *q,
                             out_tensor *t, size_t n, rlx_quantize_progress progress, void *ctx) {
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
    kv_arch_u32(&kv, arch, "block_count", c->num_hidden_layers);
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
    if (d->arch->gguf_qk_permuted) { /* what llama.cpp's LlamaModel adds */
        kv_arch_u32(&kv, arch, "vocab_size", c->vocab_size);
        kv_arch_u32(&kv, arch, "rope.dimension_count", c->head_dim);
        if (d->layers[0].window)
            kv_arch_u32(&kv, arch, "attention.sliding_window", d->layers[0].window);
    }
    rlx_status st = tokenizer_kv(&kv, tok, n_vocab, c);
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
    uint8_t *qrow = rlx__malloc((size_t)max_cols * sizeof(float));
    if (st == RLX_OK && (!row || !qrow))
        st = rlx_error(RLX_E_NOMEM, "%s: out of memory", tmp);
    size_t pos = 0;
    for (size_t i = 0; i < n && st == RLX_OK; i++) {
        if (t[i].offset > pos && fwrite(zeros, 1, t[i].offset - pos, f) != t[i].offset - pos) {
            st = rlx_error(RLX_E_IO, "%s: %s", tmp, strerror(errno));
            break;
        }
        if ((st = write_tensor(f, tmp, &t[i], row, qrow)) != RLX_OK)
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
    for (int64_t l = 0; c->num_experts > 0 && l < c->num_hidden_layers; l++)
        if (!rlx_model_config_layer_is_moe(c, l))
            return rlx_error(RLX_E_UNSUPPORTED,
                             "%s: layer %lld has a dense MLP (mlp_only_layers, decoder_sparse_step); llama.cpp's "
                             "qwen3moe has experts in every layer",
                             rlx_model_dir(m), (long long)l);
    if (c->num_experts > 0 && !c->norm_topk_prob)
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: norm_topk_prob is false; llama.cpp's qwen3moe always renormalises the top-k weights",
                         rlx_model_dir(m));
    const rlx__model_desc *d = rlx__model_desc_of(m);
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
    rlx_status st = collect(rlx_model_weights(m), d, &rope, q, &t, &n);
    char *tmp = NULL;
    if (st == RLX_OK && !(tmp = rlx__malloc(strlen(out_path) + 5)))
        st = rlx_error(RLX_E_NOMEM, "out of memory");
    if (st == RLX_OK) {
        sprintf(tmp, "%s.tmp", out_path);
        st = write_file(m, tok, tmp, q, t, n, progress, ctx);
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
