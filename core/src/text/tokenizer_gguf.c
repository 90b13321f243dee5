/* The tokenizer of a GGUF file (text_internal.h), as llama.cpp's converter writes it:
 * - tokenizer.ggml.model "gpt2": a Hugging Face byte-level BPE tokenizer. tokenizer.ggml.tokens
 *   holds every id (added tokens and padding included), tokenizer.ggml.merges the merges ("a b"),
 *   tokenizer.ggml.pre the name of the pre-tokenizer, which stands for its split regex.
 * - tokenizer.ggml.model "llama": a SentencePiece BPE vocabulary (Llama 2, Mistral) with
 *   tokenizer.ggml.scores and no merges: pieces merge by score as llama.cpp's llm_tokenizer_spm
 *   merges them, characters outside the vocabulary become their <0xNN> byte tokens, spaces are
 *   U+2581 with one prepended to each piece of text (unless tokenizer.ggml.add_space_prefix is
 *   false), which is what the Hugging Face tokenizer.json of those models does with its
 *   normalizer Prepend + Replace and its decoder Replace, ByteFallback, Fuse, Strip.
 * Token types, as llama.cpp numbers them: 1 normal, 2 unknown, 3 control (special added tokens),
 * 4 user-defined (other added tokens), 5 unused (padding), 6 byte. The special ids, whether a
 * BOS / EOS is added (tokenizer.ggml.add_bos_token / add_eos_token, else llama.cpp's default)
 * and the chat template come from the metadata too. */
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "text_internal.h"
#include "util/alloc.h"

enum {
    TOKEN_NORMAL = 1,
    TOKEN_UNKNOWN = 2,
    TOKEN_CONTROL = 3,
    TOKEN_USER_DEFINED = 4,
    TOKEN_UNUSED = 5,
    TOKEN_BYTE = 6
};

static int str_is(rlx__gguf_str s, const char *lit) { return s.len == strlen(lit) && memcmp(s.s, lit, s.len) == 0; }

/* A normalizer or decoder step over literal strings. */
static rlx_status step(rlx_tokenizer *tok, text_norm_step *steps, int *n, text_norm_kind kind, const char *a,
                       const char *b) {
    text_norm_step *s = &steps[(*n)++];
    rlx_status st;
    *s = (text_norm_step){.kind = kind, .a_len = (uint32_t)strlen(a), .b_len = b ? (uint32_t)strlen(b) : 0};
    if ((st = rlx__arena_add(tok, a, s->a_len, &s->a)) == RLX_OK && b)
        st = rlx__arena_add(tok, b, s->b_len, &s->b);
    return st;
}

/* The pre-tokenizer, normalizer and decoder of the vocabulary's kind; *spm says it is 'llama',
 * *add_bos is llama.cpp's default for it. */
static rlx_status pipeline(rlx_tokenizer *tok, const rlx__gguf *g, int *spm, int *add_bos) {
    rlx__gguf_str model, pre = {.s = "gpt2", .len = 4};
    rlx_status st = rlx__gguf_string(g, "tokenizer.ggml.model", 0, &model);
    if (st != RLX_OK)
        return st;
    *spm = str_is(model, "llama");
    *add_bos = *spm;
    if (*spm) {
        static const char space_mark[] = "\xE2\x96\x81"; /* U+2581, SentencePiece's space */
        int prefix = 1;
        if ((st = rlx__gguf_bool(g, "tokenizer.ggml.add_space_prefix", 1, &prefix)) != RLX_OK && st != RLX_E_NOT_FOUND)
            return st;
        tok->byte_fallback = 1;
        tok->decode_kind = TEXT_DECODE_TEXT;
        tok->dec_byte_fallback = 1;
        if (prefix && (st = step(tok, tok->norm, &tok->n_norm, TEXT_NORM_PREPEND, space_mark, NULL)) != RLX_OK)
            return st;
        if ((st = step(tok, tok->norm, &tok->n_norm, TEXT_NORM_REPLACE, " ", space_mark)) != RLX_OK ||
            (st = step(tok, tok->dec_replace, &tok->n_dec_replace, TEXT_NORM_REPLACE, space_mark, " ")) != RLX_OK)
            return st;
        if (prefix) {
            tok->dec_strip = 1;
            tok->dec_strip_char[0] = ' ';
            tok->dec_strip_len = 1;
        }
        return RLX_OK;
    }
    if (!str_is(model, "gpt2"))
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: tokenizer.ggml.model '%.*s' (rlx runs byte-level BPE, 'gpt2', and SentencePiece BPE, "
                         "'llama')",
                         g->path, (int)(model.len < 32 ? model.len : 32), model.s);
    tok->byte_level = 1;
    tok->decode_kind = TEXT_DECODE_BYTE_LEVEL;
    if ((st = rlx__gguf_string(g, "tokenizer.ggml.pre", 1, &pre)) != RLX_OK && st != RLX_E_NOT_FOUND)
        return st;
    for (size_t i = 0; i < rlx__n_pretok_names; i++) {
        const text_pretok_name *p = &rlx__pretok_names[i];
        if (!str_is(pre, p->name))
            continue;
        if (p->nfc && (st = step(tok, tok->norm, &tok->n_norm, TEXT_NORM_NFC, "", NULL)) != RLX_OK)
            return st;
        tok->ignore_merges = p->ignore_merges;
        *add_bos = p->add_bos;
        return rlx__pretok_regex(tok, g->path, p->pattern, 0);
    }
    return rlx_error(RLX_E_UNSUPPORTED,
                     "%s: tokenizer.ggml.pre '%.*s' (rlx runs the qwen2, llama-bpe (llama3, llama-v3) and gpt2 "
                     "(default) pre-tokenizers)",
                     g->path, (int)(pre.len < 32 ? pre.len : 32), pre.s);
}

/* tokenizer.ggml.<name>_token_id into *id (-1 when absent or outside the vocabulary). */
static rlx_status special_id(const rlx__gguf *g, const char *name, int32_t n_tokens, int32_t *id) {
    char key[64];
    snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", name);
    int64_t v;
    rlx_status st = rlx__gguf_int(g, key, 1, &v);
    *id = st == RLX_OK && v >= 0 && v < n_tokens ? (int32_t)v : -1;
    return st == RLX_E_NOT_FOUND ? RLX_OK : st;
}

/* Whether a token of this type is in the model's vocabulary (merged from, merged into); the
 * unknown token also is a special added token, as in the tokenizer.json of those models. */
static int in_model(int64_t type) { return type == TOKEN_NORMAL || type == TOKEN_UNKNOWN || type == TOKEN_BYTE; }

/* The SentencePiece scores, one per token (F32 in the file, which may be unaligned). */
static rlx_status read_scores(const rlx__gguf *g, uint64_t n, float **out) {
    const rlx__gguf_kv *kv;
    rlx_status st = rlx__gguf_array(g, "tokenizer.ggml.scores", RLX_GGUF_F32, 0, &kv);
    if (st != RLX_OK)
        return st;
    if (kv->v.arr.n != n)
        return rlx_error(RLX_E_FORMAT, "%s: tokenizer.ggml.scores has %llu entries for %llu tokens", g->path,
                         (unsigned long long)kv->v.arr.n, (unsigned long long)n);
    if (!(*out = rlx__malloc(n * sizeof **out)))
        return rlx_error(RLX_E_NOMEM, "cannot allocate %llu token scores", (unsigned long long)n);
    memcpy(*out, kv->v.arr.data, n * sizeof **out);
    return RLX_OK;
}

static rlx_status load(rlx_tokenizer *tok, const rlx__gguf *g, size_t *cap, size_t *added_cap) {
    int spm = 0, add_bos = 0, add_eos = 0;
    rlx_status st = pipeline(tok, g, &spm, &add_bos);
    const rlx__gguf_kv *tokens, *types = NULL, *merges = NULL;
    if (st == RLX_OK)
        st = rlx__gguf_array(g, "tokenizer.ggml.tokens", RLX_GGUF_STRING, 0, &tokens);
    if (st == RLX_OK &&
        (st = rlx__gguf_array(g, "tokenizer.ggml.token_type", RLX_GGUF_I64, 1, &types)) == RLX_E_NOT_FOUND)
        st = RLX_OK;
    if (st == RLX_OK && !spm)
        st = rlx__gguf_array(g, "tokenizer.ggml.merges", RLX_GGUF_STRING, 0, &merges);
    if (st != RLX_OK)
        return st;
    const uint64_t n = tokens->v.arr.n;
    if (n == 0 || n >= RLX_TEXT_MAX_TOKENS)
        return rlx_error(RLX_E_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries (1 to %d)", g->path,
                         (unsigned long long)n, RLX_TEXT_MAX_TOKENS - 1);
    if (types && types->v.arr.n != n)
        return rlx_error(RLX_E_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", g->path,
                         (unsigned long long)types->v.arr.n, (unsigned long long)n);

    text_scratch scratch = {0};
    int32_t n_model = 0;
    const uint8_t *cursor = tokens->v.arr.data;
    for (uint64_t i = 0; i < n && st == RLX_OK; i++) {
        const rlx__gguf_str s = rlx__gguf_next_string(&cursor);
        const int64_t type = types ? rlx__gguf_array_int(types, i) : TOKEN_NORMAL;
        if (!in_model(type))
            continue;
        if (memchr(s.s, '\0', s.len))
            st = rlx_error(RLX_E_FORMAT, "%s: token %llu of tokenizer.ggml.tokens contains a NUL byte", g->path,
                           (unsigned long long)i);
        else if (spm && rlx__utf8_check((const uint8_t *)s.s, s.len) != s.len)
            st = rlx_error(RLX_E_FORMAT, "%s: token %llu of tokenizer.ggml.tokens is not UTF-8", g->path,
                           (unsigned long long)i);
        else if ((st = rlx__vocab_set(tok, g->path, (int32_t)i, s.s, s.len, cap, &scratch)) == RLX_OK)
            n_model++;
    }
    free(scratch.buf);
    scratch = (text_scratch){0};
    if (st == RLX_OK)
        st = rlx__vocab_build_map(tok);
    if (st == RLX_OK && spm) {
        float *scores = NULL;
        if ((st = read_scores(g, n, &scores)) == RLX_OK)
            st = rlx__merges_from_scores(tok, scores);
        free(scores);
    } else if (st == RLX_OK) {
        st = rlx__merges_alloc(tok, (size_t)merges->v.arr.n);
        cursor = merges->v.arr.data;
        for (uint64_t i = 0; i < merges->v.arr.n && st == RLX_OK; i++) {
            const rlx__gguf_str s = rlx__gguf_next_string(&cursor);
            const char *left, *right;
            size_t left_len, right_len;
            if ((st = rlx__merge_parse(g->path, (uint32_t)i, s.s, s.len, &left, &left_len, &right, &right_len)) ==
                RLX_OK)
                st = rlx__merge_add(tok, g->path, (uint32_t)i, left, left_len, right, right_len, &scratch);
        }
    }
    free(scratch.buf);
    if (st != RLX_OK)
        return st;

    /* added tokens in id order, at their ids */
    cursor = tokens->v.arr.data;
    int32_t unk_type_id = -1;
    for (uint64_t i = 0; i < n && st == RLX_OK; i++) {
        const rlx__gguf_str s = rlx__gguf_next_string(&cursor);
        const int64_t type = types ? rlx__gguf_array_int(types, i) : TOKEN_NORMAL;
        if (type == TOKEN_UNKNOWN && unk_type_id < 0)
            unk_type_id = (int32_t)i;
        if (type != TOKEN_CONTROL && type != TOKEN_USER_DEFINED && type != TOKEN_UNKNOWN)
            continue;
        char *content = rlx__strndup(s.s, s.len);
        if (!content)
            return rlx_error(RLX_E_NOMEM, "out of memory");
        const added_spec spec = {.content = content, .special = type != TOKEN_USER_DEFINED, .id = (int32_t)i};
        st = rlx__added_token(tok, &spec, n_model, cap, added_cap);
        free(content);
    }
    int32_t unk_id = -1;
    if (st == RLX_OK)
        st = special_id(g, "eos", tok->n_tokens, &tok->eos_id);
    if (st == RLX_OK)
        st = special_id(g, "padding", tok->n_tokens, &tok->pad_id);
    if (st == RLX_OK)
        st = special_id(g, "bos", tok->n_tokens, &tok->bos_id);
    if (st == RLX_OK)
        st = special_id(g, "unknown", tok->n_tokens, &unk_id);
    if (st != RLX_OK)
        return st;
    if (unk_id < 0)
        unk_id = unk_type_id;
    rlx__vocab_byte_tokens(tok,
                           unk_id >= 0 && tok->tokens[unk_id].present ? tok->strings + tok->tokens[unk_id].str : NULL);
    if ((st = rlx__gguf_bool(g, "tokenizer.ggml.add_bos_token", 1, &add_bos)) != RLX_OK && st != RLX_E_NOT_FOUND)
        return st;
    if ((st = rlx__gguf_bool(g, "tokenizer.ggml.add_eos_token", 1, &add_eos)) != RLX_OK && st != RLX_E_NOT_FOUND)
        return st;
    if (add_bos && tok->bos_id >= 0)
        tok->prefix_ids[tok->n_prefix++] = tok->bos_id;
    if (add_eos && tok->eos_id >= 0)
        tok->suffix_ids[tok->n_suffix++] = tok->eos_id;
    rlx__gguf_str tmpl;
    if ((st = rlx__gguf_string(g, "tokenizer.chat_template", 1, &tmpl)) == RLX_OK) {
        if (!(tok->chat_template = rlx__strndup(tmpl.s, tmpl.len)))
            return rlx_error(RLX_E_NOMEM, "out of memory");
        tok->chat_kind = rlx__chat_template_kind(tok->chat_template);
        /* llama.cpp writes the named templates of a list as tokenizer.chat_template.NAME */
        if ((st = rlx__gguf_string(g, "tokenizer.chat_template.tool_use", 1, &tmpl)) == RLX_OK &&
            !(tok->chat_template_tool_use = rlx__strndup(tmpl.s, tmpl.len)))
            return rlx_error(RLX_E_NOMEM, "out of memory");
    }
    return st == RLX_E_NOT_FOUND ? RLX_OK : st;
}

rlx_status rlx__tokenizer_load_gguf(rlx_tokenizer *tok, const char *path, const rlx__gguf *g, size_t *cap,
                                    size_t *added_cap) {
    if (g) {
        rlx_status st = load(tok, g, cap, added_cap);
        /* the strings were copied: the header's pages go back to what the model left resident */
        rlx__gguf_release_header(g);
        return st;
    }
    rlx__gguf *own;
    rlx_status st = rlx__gguf_open(path, &own);
    if (st != RLX_OK)
        return st;
    st = load(tok, own, cap, added_cap);
    rlx__gguf_close(own);
    return st;
}
