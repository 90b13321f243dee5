/* A GGUF file as a model: its tensors under the Hugging Face names the block builder reads (its
 * architecture's table maps them, arch.h), and its metadata as the model description.
 *
 * llama.cpp's converter keeps Qwen3's tensors as they are (no permutation: both use NeoX RoPE)
 * and only renames them; for Llama (arch->gguf_qk_permuted) it permutes the rows of every q and
 * k head for its interleaved RoPE, which the reader undoes into buffers of its own, so the
 * builder runs the rotate-half RoPE of the Hugging Face layout on either. It stores dimensions innermost first (a [rows, cols] matrix is ne = [cols,
 * rows]) and stacks the experts of a MoE layer into one [experts, rows, cols] tensor, which is
 * split here into one view per expert. Tied embeddings are a file without output.weight. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "model_internal.h"
#include "util/alloc.h"
#include "weights_internal.h"

/* Writes the Hugging Face name of an expert's view: pattern (from rlx__arch_hf_of_gguf) with its
 * '*' replaced by the expert index; returns the length written. */
static int expert_name(const char *pattern, int64_t e, char *out, size_t len) {
    const char *star = strchr(pattern, '*');
    return snprintf(out, len, "%.*s%lld%s", (int)(star - pattern), pattern, (long long)e, star + 1);
}

/* Appends the tensors of shard g to w under their Hugging Face names in arch's table (the GGUF
 * names without one), the names stored in f. */
static rlx_status add_shard_tensors(rlx_weights *w, rlx__wfile *f, const rlx__gguf *g, const rlx__arch *arch) {
    size_t count = 0, name_bytes = 0;
    char name[256];
    for (size_t i = 0; i < g->n_tensors; i++) {
        const rlx__gguf_tensor *t = &g->tensors[i];
        const int experts = rlx__arch_hf_of_gguf(arch, t->name, name, sizeof name);
        if (experts && t->n_dims != 3)
            return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' stacks experts but has %u dimensions, not 3", g->path,
                             t->name, t->n_dims);
        const size_t n = experts ? (size_t)t->ne[2] : 1;
        count += n;
        name_bytes += n * (strlen(name) + 24);
    }
    if (count == 0)
        return RLX_OK;
    rlx_weight *grown = rlx__realloc(w->tensors, (w->n_tensors + count) * sizeof *grown);
    if (!grown)
        return rlx_error(RLX_E_NOMEM, "%s: cannot allocate the index of %zu tensors", g->path, count);
    w->tensors = grown;
    if (!(f->names = rlx__malloc(name_bytes)))
        return rlx_error(RLX_E_NOMEM, "%s: cannot allocate %zu bytes of tensor names", g->path, name_bytes);

    rlx_weight *first = w->tensors + w->n_tensors;
    char *out = f->names;
    size_t n = 0;
    for (size_t i = 0; i < g->n_tensors; i++) {
        const rlx__gguf_tensor *t = &g->tensors[i];
        const int experts = rlx__arch_hf_of_gguf(arch, t->name, name, sizeof name);
        const int64_t copies = experts ? t->ne[2] : 1;
        const size_t bytes = t->nbytes / (size_t)copies;
        for (int64_t e = 0; e < copies; e++) {
            rlx_weight *x = &first[n++];
            memset(x, 0, sizeof *x);
            const int len = experts ? expert_name(name, e, out, 256 + 24) : snprintf(out, 256 + 24, "%s", name);
            x->name = out;
            out += len + 1;
            x->dtype = t->dtype;
            x->file = f->path;
            x->data = t->data + (size_t)e * bytes;
            x->nbytes = bytes;
            /* GGUF lists dimensions innermost first; an expert's view drops the stacking one */
            x->n_dims = experts ? 2 : t->n_dims;
            for (uint32_t d = 0; d < RLX_MAX_DIMS; d++)
                x->shape[d] = d < x->n_dims ? t->ne[x->n_dims - 1 - d] : 1;
        }
    }
    rlx_status st = rlx__weights_check_file(g->path, first, n);
    if (st == RLX_OK)
        w->n_tensors += n;
    return st;
}

/* For "DIR/NAME-00001-of-00004.gguf": the part before "-00001", its length, and 4. */
static int split_name(const char *path, size_t *prefix_len, unsigned *count) {
    const size_t n = strlen(path);
    const char *tail = "-00000-of-00000.gguf";
    if (n < strlen(tail))
        return 0;
    const char *p = path + n - strlen(tail);
    unsigned index, total;
    int used = 0;
    if (sscanf(p, "-%5u-of-%5u.gguf%n", &index, &total, &used) != 2 || (size_t)used != strlen(tail))
        return 0;
    *prefix_len = (size_t)(p - path);
    *count = total;
    return index;
}

/* The split metadata of shard number `no` (0-based) of a set of `count`: when the file has the
 * keys, they must agree with its name. */
static rlx_status check_split(const rlx__gguf *g, unsigned no, unsigned count) {
    int64_t v;
    rlx_status st = rlx__gguf_int(g, "split.count", 1, &v);
    if (st == RLX_OK && v != (int64_t)count)
        return rlx_error(RLX_E_FORMAT,
                         "%s: metadata key 'split.count' is %" PRId64 ", but the file name says %u shards", g->path, v,
                         count);
    if (st != RLX_OK && st != RLX_E_NOT_FOUND)
        return st;
    st = rlx__gguf_int(g, "split.no", 1, &v);
    if (st == RLX_OK && v != (int64_t)no)
        return rlx_error(RLX_E_FORMAT, "%s: metadata key 'split.no' is %" PRId64 ", but the file name says shard %u",
                         g->path, v, no);
    return st == RLX_E_NOT_FOUND ? RLX_OK : st;
}

/* The head count of a q tensor ("attention.head_count") or a k tensor ("attention.head_count_kv",
 * the former when absent) of shard g, under the file's architecture prefix. */
static rlx_status head_count(const rlx__gguf *g, const char *arch, int k, int64_t *out) {
    char key[96];
    snprintf(key, sizeof key, "%s.attention.head_count%s", arch, k ? "_kv" : "");
    rlx_status st = rlx__gguf_int(g, key, k, out);
    if (st == RLX_E_NOT_FOUND)
        return head_count(g, arch, 0, out);
    if (st == RLX_OK && (*out <= 0 || *out > INT32_MAX))
        return rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' is %" PRId64 ", not a positive count", g->path, key,
                         *out);
    return st;
}

/* Undoes llama.cpp's q/k row permutation (arch.h, gguf_qk_permuted) on every q and k weight and
 * bias of w: each is copied into a buffer w owns, in Hugging Face's row order. */
static rlx_status undo_qk_permutation(rlx_weights *w, const rlx__gguf *g, const char *arch) {
    for (size_t i = 0; i < w->n_tensors; i++) {
        rlx_weight *x = &w->tensors[i];
        unsigned layer;
        char which, kind[8];
        int used = 0;
        if (sscanf(x->name, "model.layers.%u.self_attn.%c_proj.%7s%n", &layer, &which, kind, &used) != 3 ||
            x->name[used] != '\0' || (which != 'q' && which != 'k') ||
            (strcmp(kind, "weight") != 0 && strcmp(kind, "bias") != 0))
            continue;
        int64_t heads;
        rlx_status st = head_count(g, arch, which == 'k', &heads);
        if (st != RLX_OK)
            return st;
        const int64_t rows = x->shape[0];
        const int64_t head_rows = rows / heads;
        if (rows % heads != 0 || head_rows % 2 != 0 || x->nbytes % (size_t)rows != 0)
            return rlx_error(RLX_E_FORMAT,
                             "%s: tensor '%s' has %" PRId64 " rows, not %" PRId64 " heads of an even size", g->path,
                             rlx__weights_gguf_name(w, x) ? rlx__weights_gguf_name(w, x) : x->name, rows, heads);
        uint8_t *copy = rlx__weights_own(w, x->nbytes);
        if (!copy)
            return rlx_error(RLX_E_NOMEM, "%s: cannot allocate %zu bytes for tensor '%s'", g->path, x->nbytes, x->name);
        const size_t row_bytes = x->nbytes / (size_t)rows;
        for (int64_t row = 0; row < rows; row++)
            memcpy(copy + (size_t)rlx__qk_hf_row(row, head_rows) * row_bytes,
                   (const uint8_t *)x->data + (size_t)row * row_bytes, row_bytes);
        rlx__drop_mapped(x->data, x->nbytes); /* the file's order is not read again */
        x->data = copy;
    }
    return RLX_OK;
}

rlx_status rlx__weights_open_gguf(const char *path, rlx_weights **out) {
    *out = NULL;
    size_t prefix_len = 0;
    unsigned count = 1;
    const int index = split_name(path, &prefix_len, &count);
    if (index > 1)
        return rlx_error(RLX_E_INVALID, "%s is shard %d of a split GGUF model; give the first, %.*s-00001-of-%05u.gguf",
                         path, index, (int)prefix_len, path, count);
    if (index == 1 && count == 0)
        return rlx_error(RLX_E_INVALID, "%s: a split GGUF name with 0 shards", path);
    if (!index)
        count = 1;
    rlx_weights *w = rlx__calloc(1, sizeof *w);
    if (!w || !(w->files = rlx__calloc(count, sizeof *w->files)) || !(w->gguf = rlx__calloc(count, sizeof *w->gguf))) {
        rlx_weights_close(w);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    }
    rlx_status st = RLX_OK;
    const rlx__arch *arch = NULL;
    char arch_name[32] = "";
    for (unsigned i = 0; i < count && st == RLX_OK; i++) {
        rlx__wfile *f = &w->files[w->n_files];
        const size_t len = strlen(path) + 1;
        if (!(f->path = rlx__malloc(len))) {
            st = rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
            break;
        }
        if (index)
            snprintf(f->path, len, "%.*s-%05u-of-%05u.gguf", (int)prefix_len, path, i + 1, count);
        else
            memcpy(f->path, path, len);
        const char *slash = strrchr(f->path, '/');
        f->name = slash ? slash + 1 : f->path;
        w->n_files++;
        if ((st = rlx__gguf_open(f->path, &w->gguf[w->n_gguf])) != RLX_OK)
            break;
        const rlx__gguf *g = w->gguf[w->n_gguf++];
        if (index)
            st = check_split(g, i, count);
        rlx__gguf_str name;
        /* without a known architecture the names stay; the configuration then refuses the model */
        if (i == 0 && rlx__gguf_string(g, "general.architecture", 1, &name) == RLX_OK &&
            (arch = rlx__arch_by_gguf(name.s, name.len)))
            snprintf(arch_name, sizeof arch_name, "%.*s", (int)name.len, name.s);
        if (st == RLX_OK)
            st = add_shard_tensors(w, f, g, arch);
    }
    if (st == RLX_OK)
        st = rlx__weights_index(w);
    if (st == RLX_OK && arch && arch->gguf_qk_permuted)
        st = undo_qk_permutation(w, w->gguf[0], arch_name);
    if (st != RLX_OK) {
        rlx_weights_close(w);
        return st;
    }
    *out = w;
    return RLX_OK;
}

const struct rlx__gguf *rlx__weights_gguf(const rlx_weights *w) { return w && w->n_gguf ? w->gguf[0] : NULL; }

void rlx__weights_release_gguf_headers(const rlx_weights *w) {
    for (size_t i = 0; w && i < w->n_gguf; i++)
        rlx__gguf_release_header(w->gguf[i]);
}

const char *rlx__weights_gguf_name(const rlx_weights *w, const rlx_weight *t) {
    for (size_t i = 0; w && t && i < w->n_gguf; i++)
        for (size_t k = 0; k < w->gguf[i]->n_tensors; k++) {
            const rlx__gguf_tensor *g = &w->gguf[i]->tensors[k];
            const uint8_t *p = t->data;
            if (p >= g->data && p < g->data + g->nbytes)
                return g->name;
        }
    return NULL;
}

// ---- configuration

int64_t rlx__gguf_cfg_int(rlx__gguf_cfg *r, const char *name, int optional, int64_t dflt) {
    char key[96];
    int64_t v = dflt;
    if (r->st != RLX_OK)
        return dflt;
    snprintf(key, sizeof key, "%s.%s", r->arch, name);
    rlx_status st = rlx__gguf_int(r->g, key, optional, &v);
    if (st == RLX_E_NOT_FOUND)
        return dflt;
    if (st == RLX_OK && (v <= 0 || v > INT32_MAX))
        st = rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' is %" PRId64 ", not a positive count", r->g->path, key, v);
    r->st = st;
    return v;
}

double rlx__gguf_cfg_float(rlx__gguf_cfg *r, const char *name, double dflt) {
    char key[96];
    double v = dflt;
    if (r->st != RLX_OK)
        return dflt;
    snprintf(key, sizeof key, "%s.%s", r->arch, name);
    rlx_status st = rlx__gguf_float(r->g, key, 1, &v);
    if (st == RLX_OK && !(v > 0))
        st = rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' is %g, not a positive number", r->g->path, key, v);
    if (st != RLX_E_NOT_FOUND)
        r->st = st;
    return st == RLX_OK ? v : dflt;
}

/* Adds id to the EOS list once (ids outside the vocabulary are the caller's to reject). */
static void add_eos(rlx_model_config *c, int64_t id) {
    for (uint32_t i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return;
    if (c->n_eos < RLX_MAX_EOS && id >= 0 && id <= INT32_MAX)
        c->eos_ids[c->n_eos++] = (int32_t)id;
}

/* End-of-generation ids: the metadata's eos (and end-of-turn) ids, and the control tokens that
 * end a turn or a text in Qwen's vocabulary, which Hugging Face's generation_config.json lists
 * as EOS and llama.cpp recognises by their text. */
static rlx_status config_eos(const rlx__gguf *g, rlx_model_config *c) {
    static const char *const id_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"};
    for (size_t i = 0; i < sizeof id_keys / sizeof id_keys[0]; i++) {
        int64_t id;
        rlx_status st = rlx__gguf_int(g, id_keys[i], 1, &id);
        if (st == RLX_OK)
            add_eos(c, id);
        else if (st != RLX_E_NOT_FOUND)
            return st;
    }
    const rlx__gguf_kv *tokens, *types;
    if (rlx__gguf_array(g, "tokenizer.ggml.tokens", RLX_GGUF_STRING, 1, &tokens) != RLX_OK ||
        rlx__gguf_array(g, "tokenizer.ggml.token_type", RLX_GGUF_I64, 1, &types) != RLX_OK ||
        types->v.arr.n != tokens->v.arr.n)
        return RLX_OK; /* the tokenizer reports a broken vocabulary itself */
    const uint8_t *cursor = tokens->v.arr.data;
    for (uint64_t i = 0; i < tokens->v.arr.n; i++) {
        const rlx__gguf_str s = rlx__gguf_next_string(&cursor);
        const int control = rlx__gguf_array_int(types, i) == 3;
        if (control && ((s.len == 10 && memcmp(s.s, "<|im_end|>", 10) == 0) ||
                        (s.len == 13 && memcmp(s.s, "<|endoftext|>", 13) == 0)))
            add_eos(c, (int64_t)i);
    }
    int64_t bos;
    rlx_status st = rlx__gguf_int(g, "tokenizer.ggml.bos_token_id", 1, &bos);
    c->bos_id = st == RLX_OK && bos >= 0 && bos <= INT32_MAX ? (int32_t)bos : -1;
    return st == RLX_E_NOT_FOUND || st == RLX_OK ? RLX_OK : st;
}

/* rope_freqs.weight, the per-pair frequency divisors llama.cpp's converter writes for Llama 3.1's
 * rope_scaling (arch.h, RLX__ROPE_LLAMA3), into d when the file has it. */
static rlx_status read_rope_freqs(const rlx__gguf_cfg *r, rlx__model_desc *d) {
    const rlx_weight *t = rlx_weights_find(r->w, "rope_freqs.weight");
    if (!t)
        return RLX_OK;
    const int64_t half = (d->rope_dims ? d->rope_dims : d->cfg.head_dim) / 2;
    if (t->dtype != RLX_DTYPE_F32 || t->n_dims != 1 || t->shape[0] != half)
        return rlx_error(RLX_E_FORMAT,
                         "%s: tensor 'rope_freqs.weight' is not F32 [%" PRId64
                         "] (head_dim / 2, or rope.dimension_count / 2 where RoPE turns part of each head)",
                         r->path, half);
    if (!(d->rope_freqs = rlx__malloc((size_t)half * sizeof *d->rope_freqs)))
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", r->path);
    memcpy(d->rope_freqs, t->data, (size_t)half * sizeof *d->rope_freqs);
    for (int64_t i = 0; i < half; i++)
        if (!(d->rope_freqs[i] > 0 && d->rope_freqs[i] < 1e30f))
            return rlx_error(RLX_E_FORMAT,
                             "%s: tensor 'rope_freqs.weight' holds %g at %" PRId64 ", not a positive factor", r->path,
                             (double)d->rope_freqs[i], i);
    d->rope_type = RLX__ROPE_LLAMA3;
    return RLX_OK;
}

rlx_status rlx__gguf_read_decoder(rlx__gguf_cfg *r, int ff_optional, rlx__model_desc *d) {
    rlx_model_config *c = &d->cfg;
    const char *path = r->path;
    const rlx_weight *embed = rlx_weights_find(r->w, "model.embed_tokens.weight");
    if (!embed || embed->n_dims != 2)
        return rlx_error(RLX_E_FORMAT, "%s: no 2-dimensional tensor 'token_embd.weight'", path);
    c->hidden_size = rlx__gguf_cfg_int(r, "embedding_length", 0, 0);
    c->num_hidden_layers = rlx__gguf_cfg_int(r, "block_count", 0, 0);
    /* next-token-prediction (MTP) layers are blocks appended after the model's own */
    char key[96];
    int64_t nextn = 0;
    snprintf(key, sizeof key, "%s.nextn_predict_layers", r->arch);
    rlx_status st = r->st == RLX_OK ? rlx__gguf_int(r->g, key, 1, &nextn) : r->st;
    if (st != RLX_OK && st != RLX_E_NOT_FOUND)
        return st;
    if (nextn < 0 || (r->st == RLX_OK && nextn >= c->num_hidden_layers))
        return rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' is %" PRId64 ", not below block_count %" PRId64, path,
                         key, nextn, c->num_hidden_layers);
    c->num_hidden_layers -= nextn;
    c->num_attention_heads = rlx__gguf_cfg_int(r, "attention.head_count", 0, 0);
    c->num_key_value_heads = rlx__gguf_cfg_int(r, "attention.head_count_kv", 1, c->num_attention_heads);
    c->max_position_embeddings = rlx__gguf_cfg_int(r, "context_length", 0, 0);
    c->vocab_size = rlx__gguf_cfg_int(r, "vocab_size", 1, embed->shape[0]);
    c->intermediate_size = rlx__gguf_cfg_int(r, "feed_forward_length", ff_optional, 0);
    c->rms_norm_eps = rlx__gguf_cfg_float(r, "attention.layer_norm_rms_epsilon", 1e-6);
    c->rope_theta = rlx__gguf_cfg_float(r, "rope.freq_base", 10000.0); /* llama.cpp's default */
    if (r->st != RLX_OK)
        return r->st;
    c->head_dim = rlx__gguf_cfg_int(r, "attention.key_length", 1, c->hidden_size / c->num_attention_heads);
    const int64_t value_length = rlx__gguf_cfg_int(r, "attention.value_length", 1, c->head_dim);
    if (r->st != RLX_OK)
        return r->st;
    if (value_length != c->head_dim)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: attention value_length %" PRId64 " differs from key_length %" PRId64,
                         path, value_length, c->head_dim);
    /* RoPE over part of each head (llama.cpp's n_rot < head_dim): the first rope_dims values of a
     * head turn, NeoX-style; a converter that permutes q and k rows for interleaved RoPE does it
     * over whole heads only */
    const int64_t rope_dims = rlx__gguf_cfg_int(r, "rope.dimension_count", 1, c->head_dim);
    if (r->st != RLX_OK)
        return r->st;
    if (rope_dims != c->head_dim && (d->arch->gguf_qk_permuted || rope_dims > c->head_dim || rope_dims % 2))
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: metadata key '%s.rope.dimension_count' is %" PRId64 ", not head_dim %" PRId64
                         " or an even part of it",
                         path, r->arch, rope_dims, c->head_dim);
    d->rope_dims = rope_dims == c->head_dim ? 0 : rope_dims;
    if (c->num_hidden_layers > RLX_MAX_LAYERS)
        return rlx_error(RLX_E_FORMAT, "%s: %" PRId64 " layers (rlx supports at most %d)", path, c->num_hidden_layers,
                         RLX_MAX_LAYERS);
    if (c->num_attention_heads % c->num_key_value_heads)
        return rlx_error(RLX_E_FORMAT, "%s: %" PRId64 " attention heads are not a multiple of %" PRId64 " KV heads",
                         path, c->num_attention_heads, c->num_key_value_heads);
    if (!(d->layers = rlx__calloc((size_t)c->num_hidden_layers, sizeof *d->layers)))
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    c->tie_word_embeddings = rlx_weights_find(r->w, "lm_head.weight") == NULL;
    d->rope_type = RLX__ROPE_DEFAULT;
    return read_rope_freqs(r, d);
}

/* A RoPE scaling type in GGUF metadata (linear, yarn, ...): refused. Llama 3.1's scaling has no
 * type key; its divisors are the rope_freqs tensor (read_rope_freqs). */
static rlx_status check_rope_scaling(const rlx__gguf_cfg *r) {
    rlx__gguf_str scaling;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", r->arch);
    rlx_status st = rlx__gguf_string(r->g, key, 1, &scaling);
    if (st == RLX_OK && !(scaling.len == 4 && memcmp(scaling.s, "none", 4) == 0))
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: metadata key '%s' is '%.*s'; rlx runs plain RoPE and Llama 3.1's (rope_freqs)", r->path,
                         key, (int)(scaling.len < 32 ? scaling.len : 32), scaling.s);
    return st == RLX_E_NOT_FOUND ? RLX_OK : st;
}

rlx_status rlx__model_desc_from_gguf(const rlx_weights *w, rlx__model_desc *out) {
    const rlx__gguf *g = rlx__weights_gguf(w);
    rlx__model_desc d;
    memset(&d, 0, sizeof d);
    rlx__gguf_str arch;
    rlx_status st = rlx__gguf_string(g, "general.architecture", 0, &arch);
    if (st != RLX_OK)
        return st;
    char list[RLX__ARCH_LIST_SIZE];
    if (!(d.arch = rlx__arch_by_gguf(arch.s, arch.len)))
        return rlx_error(RLX_E_UNSUPPORTED, "%s: architecture '%.*s' is one rlx does not run; it runs %s", g->path,
                         (int)(arch.len < 64 ? arch.len : 64), arch.s, rlx__arch_list(list, sizeof list));
    rlx__gguf_cfg r = {.g = g, .w = w, .path = g->path};
    snprintf(r.arch, sizeof r.arch, "%.*s", (int)arch.len, arch.s);
    snprintf(d.cfg.model_type, sizeof d.cfg.model_type, "%s", d.arch->name);
    if ((st = d.arch->read_gguf(&r, &d)) == RLX_OK && (st = check_rope_scaling(&r)) == RLX_OK)
        st = config_eos(g, &d.cfg);
    if (st != RLX_OK) {
        rlx__model_desc_free(&d);
        return st;
    }
    rlx__model_desc_project(&d);
    *out = d;
    return RLX_OK;
}

rlx_status rlx__model_config_from_gguf(const rlx_weights *w, rlx_model_config *out) {
    rlx__model_desc d;
    rlx_status st = rlx__model_desc_from_gguf(w, &d);
    if (st == RLX_OK) {
        *out = d.cfg;
        rlx__model_desc_free(&d);
    }
    return st;
}

rlx_status rlx_model_gguf_string(const rlx_model *m, const char *key, const char **text, size_t *len) {
    if (!m || !key || !text || !len)
        return rlx_error(RLX_E_INVALID, "rlx_model_gguf_string: NULL argument");
    const rlx__gguf *g = rlx__weights_gguf(rlx_model_weights(m));
    rlx__gguf_str str = {0};
    const rlx_status st = g ? rlx__gguf_string(g, key, 1, &str) : RLX_E_NOT_FOUND;
    *text = str.s;
    *len = str.len;
    return st;
}

rlx_status rlx_model_gguf_int(const rlx_model *m, const char *key, int64_t *out) {
    if (!m || !key || !out)
        return rlx_error(RLX_E_INVALID, "rlx_model_gguf_int: NULL argument");
    const rlx__gguf *g = rlx__weights_gguf(rlx_model_weights(m));
    return g ? rlx__gguf_int(g, key, 1, out) : RLX_E_NOT_FOUND;
}
