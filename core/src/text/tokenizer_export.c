/* The GGUF writer's view of a tokenizer (tokenizer_export.h). */
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"
#include "tokenizer_export.h"
#include "util/alloc.h"

const char *rlx__tokenizer_token(const rlx_tokenizer *tok, int32_t id, size_t *len, int *type) {
    if (!tok || id < 0 || id >= tok->n_tokens || !tok->tokens[id].present)
        return NULL;
    const text_token *t = &tok->tokens[id];
    const char *s = tok->strings + t->str;
    *len = t->str_len;
    /* llama.cpp's converter also counts an added token that looks like one ("<|...|>") as control */
    const int looks_special = t->str_len >= 4 && memcmp(s, "<|", 2) == 0 && memcmp(s + t->str_len - 2, "|>", 2) == 0;
    if (!tok->byte_level && id == tok->unk_id)
        *type = 2;
    else if (t->fallback && t->in_model)
        *type = 6;
    else
        *type = !t->added ? 1 : t->special || looks_special ? 3 : 4;
    return s;
}

/* The normalizer step i is kind with these strings (b may be NULL for Prepend). */
static int step_is(const rlx_tokenizer *tok, const text_norm_step *st, text_norm_kind kind, const char *a,
                   const char *b) {
    return st->kind == kind && st->a_len == strlen(a) && memcmp(tok->strings + st->a, a, st->a_len) == 0 &&
           (!b || (st->b_len == strlen(b) && memcmp(tok->strings + st->b, b, st->b_len) == 0));
}

rlx_status rlx__tokenizer_gguf(const rlx_tokenizer *tok, rlx__tokenizer_gguf_kind *out) {
    static const char mark[] = "\xE2\x96\x81"; /* U+2581 */
    memset(out, 0, sizeof *out);
    out->add_bos = tok->n_prefix == 1 && tok->prefix_ids[0] == tok->bos_id;
    out->add_eos = tok->n_suffix == 1 && tok->suffix_ids[0] == tok->eos_id;
    if (tok->byte_level) {
        const text_pretok_name *p = tok->pre_name;
        if (!p || tok->decode_kind != TEXT_DECODE_BYTE_LEVEL || p->nfc != tok->nfc || (!p->nfc && tok->n_norm) ||
            p->ignore_merges != tok->ignore_merges)
            return rlx_error(RLX_E_UNSUPPORTED,
                             "GGUF has no tokenizer.ggml.pre for this tokenizer: llama.cpp names the split regexes "
                             "of Qwen2 (with NFC), Llama 3 (with ignore_merges) and GPT-2");
        out->model = "gpt2";
        out->pre = p->name;
        return RLX_OK;
    }
    /* SentencePiece: [Prepend(U+2581),] Replace(' ', U+2581) and the decoder undoing it */
    int prefix = tok->n_norm == 2 && step_is(tok, &tok->norm[0], TEXT_NORM_PREPEND, mark, NULL);
    if (!tok->byte_fallback || tok->re || tok->metaspace || tok->n_norm != prefix + 1 ||
        !step_is(tok, &tok->norm[prefix], TEXT_NORM_REPLACE, " ", mark) || tok->decode_kind != TEXT_DECODE_TEXT ||
        !tok->dec_byte_fallback || tok->n_dec_replace != 1 ||
        !step_is(tok, &tok->dec_replace[0], TEXT_NORM_REPLACE, mark, " ") || tok->dec_metaspace_first ||
        tok->dec_strip != (uint32_t)prefix || (prefix && tok->dec_strip_char[0] != ' '))
        return rlx_error(RLX_E_UNSUPPORTED,
                         "GGUF has no tokenizer.ggml.model for this tokenizer: llama.cpp's are byte-level BPE with a "
                         "split regex it names, and SentencePiece BPE with byte fallback whose spaces are U+2581 "
                         "(normalizer [Prepend +] Replace, no pre-tokenizer)");
    out->model = "llama";
    out->add_space_prefix = prefix;
    return RLX_OK;
}

rlx_status rlx__tokenizer_scores(const rlx_tokenizer *tok, int64_t n, float **scores) {
    float *s = rlx__calloc(n > 0 ? (size_t)n : 1, sizeof *s);
    if (!s)
        return rlx_error(RLX_E_NOMEM, "cannot allocate %lld token scores", (long long)n);
    for (size_t i = 0; i < tok->merge_cap; i++) {
        const int32_t id = tok->merge_id[i];
        if (tok->merge_keys[i] == UINT64_MAX || id < 0 || id >= n)
            continue;
        const float score = -(float)tok->merge_rank[i];
        if (s[id] == 0.0f || score > s[id])
            s[id] = score;
    }
    *scores = s;
    return RLX_OK;
}

typedef struct ranked {
    uint32_t rank;
    int32_t a, b;
} ranked;

static int cmp_rank(const void *x, const void *y) {
    const ranked *p = x, *q = y;
    return (p->rank > q->rank) - (p->rank < q->rank);
}

rlx_status rlx__tokenizer_merges(const rlx_tokenizer *tok, int32_t **pairs, size_t *n) {
    size_t count = 0;
    for (size_t i = 0; i < tok->merge_cap; i++)
        count += tok->merge_keys[i] != UINT64_MAX;
    ranked *r = rlx__malloc((count ? count : 1) * sizeof *r);
    int32_t *out = rlx__malloc((count ? count : 1) * 2 * sizeof *out);
    if (!r || !out) {
        free(r);
        free(out);
        return rlx_error(RLX_E_NOMEM, "cannot allocate the list of %zu merges", count);
    }
    size_t k = 0;
    for (size_t i = 0; i < tok->merge_cap; i++) {
        const uint64_t key = tok->merge_keys[i];
        if (key != UINT64_MAX)
            r[k++] = (ranked){tok->merge_rank[i], (int32_t)(key >> 32), (int32_t)(uint32_t)key};
    }
    qsort(r, count, sizeof *r, cmp_rank);
    for (size_t i = 0; i < count; i++) {
        out[2 * i] = r[i].a;
        out[2 * i + 1] = r[i].b;
    }
    free(r);
    *pairs = out;
    *n = count;
    return RLX_OK;
}

const char *rlx__tokenizer_chat_template(const rlx_tokenizer *tok) { return tok ? tok->chat_template : NULL; }
