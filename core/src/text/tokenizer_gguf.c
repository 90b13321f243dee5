/* The tokenizer of a GGUF file (text_internal.h): llama.cpp's converter writes a Hugging Face
 * byte-level BPE tokenizer as tokenizer.ggml.tokens (every id, added tokens and padding
 * included), tokenizer.ggml.token_type per id, tokenizer.ggml.merges ("a b"), the name of the
 * pre-tokenizer in tokenizer.ggml.pre, and the special ids. Token types, as llama.cpp numbers
 * them: 1 normal, 2 unknown, 3 control (special added tokens), 4 user-defined (other added
 * tokens), 5 unused (padding), 6 byte. */
#include <string.h>

#include "model/gguf.h"
#include "text_internal.h"
#include "util/alloc.h"

enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4, TOKEN_UNUSED = 5 };

/* Qwen2's split pattern (its tokenizer.json's Split pre-tokenizer), which llama.cpp calls qwen2. */
static const char qwen2_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int str_is(rlx__gguf_str s, const char *lit) { return s.len == strlen(lit) && memcmp(s.s, lit, s.len) == 0; }

static rlx_status pre_tokenizer(rlx_tokenizer *tok, const rlx__gguf *g) {
    rlx__gguf_str model, pre = {.s = "gpt2", .len = 4};
    rlx_status st = rlx__gguf_string(g, "tokenizer.ggml.model", 0, &model);
    if (st != RLX_OK)
        return st;
    if (!str_is(model, "gpt2"))
        return rlx_error(RLX_E_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' (rlx runs byte-level BPE, 'gpt2')",
                         g->path, (int)(model.len < 32 ? model.len : 32), model.s);
    if ((st = rlx__gguf_string(g, "tokenizer.ggml.pre", 1, &pre)) != RLX_OK && st != RLX_E_NOT_FOUND)
        return st;
    if (str_is(pre, "qwen2")) {
        tok->nfc = 1; /* Qwen2's tokenizer.json normalises to NFC */
        return rlx__pretok_regex(tok, g->path, qwen2_pattern, 0);
    }
    if (str_is(pre, "gpt2") || str_is(pre, "default"))
        return rlx__pretok_regex(tok, g->path, rlx__gpt2_pattern, 0);
    return rlx_error(RLX_E_UNSUPPORTED, "%s: tokenizer.ggml.pre '%.*s' (rlx runs the qwen2 and gpt2 pre-tokenizers)",
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

static rlx_status load(rlx_tokenizer *tok, const rlx__gguf *g, size_t *cap, size_t *added_cap) {
    rlx_status st = pre_tokenizer(tok, g);
    const rlx__gguf_kv *tokens, *types = NULL, *merges;
    if (st == RLX_OK)
        st = rlx__gguf_array(g, "tokenizer.ggml.tokens", RLX_GGUF_STRING, 0, &tokens);
    if (st == RLX_OK &&
        (st = rlx__gguf_array(g, "tokenizer.ggml.token_type", RLX_GGUF_I64, 1, &types)) == RLX_E_NOT_FOUND)
        st = RLX_OK;
    if (st == RLX_OK)
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
        if (type == TOKEN_CONTROL || type == TOKEN_USER_DEFINED || type == TOKEN_UNUSED)
            continue;
        if (memchr(s.s, '\0', s.len))
            st = rlx_error(RLX_E_FORMAT, "%s: token %llu of tokenizer.ggml.tokens contains a NUL byte", g->path,
                           (unsigned long long)i);
        else if ((st = rlx__vocab_set(tok, g->path, (int32_t)i, s.s, s.len, cap, &scratch)) == RLX_OK)
            n_model++;
    }
    if (st == RLX_OK)
        st = rlx__vocab_build_map(tok);
    if (st == RLX_OK)
        st = rlx__merges_alloc(tok, (size_t)merges->v.arr.n);
    cursor = merges->v.arr.data;
    for (uint64_t i = 0; i < merges->v.arr.n && st == RLX_OK; i++) {
        const rlx__gguf_str s = rlx__gguf_next_string(&cursor);
        const char *left, *right;
        size_t left_len, right_len;
        if ((st = rlx__merge_parse(g->path, (uint32_t)i, s.s, s.len, &left, &left_len, &right, &right_len)) == RLX_OK)
            st = rlx__merge_add(tok, g->path, (uint32_t)i, left, left_len, right, right_len, &scratch);
    }
    free(scratch.buf);
    if (st != RLX_OK)
        return st;
    rlx__vocab_byte_tokens(tok);

    /* added tokens in id order, at their ids */
    cursor = tokens->v.arr.data;
    for (uint64_t i = 0; i < n && st == RLX_OK; i++) {
        const rlx__gguf_str s = rlx__gguf_next_string(&cursor);
        const int64_t type = types ? rlx__gguf_array_int(types, i) : TOKEN_NORMAL;
        if (type != TOKEN_CONTROL && type != TOKEN_USER_DEFINED)
            continue;
        char *content = rlx__strndup(s.s, s.len);
        if (!content)
            return rlx_error(RLX_E_NOMEM, "out of memory");
        const added_spec spec = {.content = content, .special = type == TOKEN_CONTROL, .id = (int32_t)i};
        st = rlx__added_token(tok, &spec, n_model, cap, added_cap);
        free(content);
    }
    if (st == RLX_OK)
        st = special_id(g, "eos", tok->n_tokens, &tok->eos_id);
    if (st == RLX_OK)
        st = special_id(g, "padding", tok->n_tokens, &tok->pad_id);
    if (st == RLX_OK)
        st = special_id(g, "bos", tok->n_tokens, &tok->bos_id);
    rlx__gguf_str tmpl;
    if (st == RLX_OK && (st = rlx__gguf_string(g, "tokenizer.chat_template", 1, &tmpl)) == RLX_OK) {
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
