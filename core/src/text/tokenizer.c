/* Loading a Hugging Face tokenizer.json (byte-level or SentencePiece-style BPE) and
 * tokenizer_config.json.
 *
 * What is accepted, and how added tokens get their ids, follows the Rust `tokenizers` library
 * (TokenizerImpl deserialisation, AddedVocabulary::add_tokens) and transformers'
 * PreTrainedTokenizerFast, which adds the tokens of tokenizer_config.json that tokenizer.json
 * lacks. Anything that would change ids and is not implemented is refused by name. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/gguf.h"
#include "model/model_internal.h"
#include "text_internal.h"
#include "util/alloc.h"
#include "util/json.h"

/* Far above any tokenizer's vocabulary and merges (Qwen3: 151669 tokens, 151387 merges). */
#define CHAT_TEMPLATE_MAX_BYTES (1 << 20)

// ---- byte-level alphabet

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100 onwards, so every byte is a visible character. */
static void byte_level_tables(uint32_t byte_to_cp[256], int16_t cp_to_byte[324]) {
    int n = 0;
    for (int i = 0; i < 324; i++)
        cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

static size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* the byte-level alphabet stays below U+0800 */
}

// ---- sizes

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

// ---- string arena

rlx_status rlx__arena_add(rlx_tokenizer *tok, const char *s, size_t len, uint32_t *off) {
    if (tok->strings_len + len + 1 > UINT32_MAX)
        return rlx_error(RLX_E_FORMAT, "tokenizer strings exceed 4 GiB");
    if (tok->strings_len + len + 1 > tok->strings_cap) {
        size_t cap = tok->strings_cap ? tok->strings_cap : 1 << 20;
        while (cap < tok->strings_len + len + 1)
            cap *= 2;
        char *grown = rlx__realloc(tok->strings, cap);
        if (!grown)
            return rlx_error(RLX_E_NOMEM, "cannot allocate %zu bytes for token strings", cap);
        tok->strings = grown;
        tok->strings_cap = cap;
    }
    memcpy(tok->strings + tok->strings_len, s, len);
    tok->strings[tok->strings_len + len] = '\0';
    *off = (uint32_t)tok->strings_len;
    tok->strings_len += len + 1;
    return RLX_OK;
}

// ---- JSON helpers

static const cJSON *get(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

/* A string field or null/absent (NULL). */
static rlx_status opt_string(const char *path, const char *where, const cJSON *obj, const char *key, const char **out) {
    const cJSON *item = get(obj, key);
    *out = NULL;
    if (!item || cJSON_IsNull(item))
        return RLX_OK;
    if (!cJSON_IsString(item))
        return rlx_error(RLX_E_FORMAT, "%s: %s.%s must be a string", path, where, key);
    *out = item->valuestring;
    return RLX_OK;
}

static rlx_status opt_bool(const char *path, const char *where, const cJSON *obj, const char *key, int dflt, int *out) {
    const cJSON *item = get(obj, key);
    *out = dflt;
    if (!item || cJSON_IsNull(item))
        return RLX_OK;
    if (!cJSON_IsBool(item))
        return rlx_error(RLX_E_FORMAT, "%s: %s.%s must be true or false", path, where, key);
    *out = cJSON_IsTrue(item);
    return RLX_OK;
}

static const char *type_of(const cJSON *obj) {
    const cJSON *t = cJSON_IsObject(obj) ? get(obj, "type") : NULL;
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

// ---- components

/* A Replace step's {"String": ...} pattern (a Regex pattern is refused by name). */
static rlx_status replace_pattern(const char *path, const char *where, const cJSON *step, const char **from,
                                  const char **to) {
    const cJSON *pattern = get(step, "pattern");
    const cJSON *string = cJSON_IsObject(pattern) ? get(pattern, "String") : NULL;
    const cJSON *content = get(step, "content");
    if (cJSON_IsObject(pattern) && get(pattern, "Regex"))
        return rlx_error(RLX_E_UNSUPPORTED, "%s: %s Replace with a Regex pattern is not supported (only String)", path,
                         where);
    if (!cJSON_IsString(string) || !*string->valuestring || !cJSON_IsString(content))
        return rlx_error(RLX_E_FORMAT, "%s: %s Replace needs a pattern {\"String\": ...} and a content string", path,
                         where);
    *from = string->valuestring;
    *to = content->valuestring;
    return RLX_OK;
}

static rlx_status add_step(rlx_tokenizer *tok, const char *path, const char *where, text_norm_step *steps, int *n,
                           text_norm_kind kind, const char *a, const char *b) {
    rlx_status st;
    if (*n == TEXT_MAX_NORM_STEPS)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: more than %d %s steps", path, TEXT_MAX_NORM_STEPS, where);
    text_norm_step *step = &steps[(*n)++];
    *step = (text_norm_step){.kind = kind};
    if (a) {
        step->a_len = (uint32_t)strlen(a);
        if ((st = rlx__arena_add(tok, a, step->a_len, &step->a)) != RLX_OK)
            return st;
    }
    if (b) {
        step->b_len = (uint32_t)strlen(b);
        if ((st = rlx__arena_add(tok, b, step->b_len, &step->b)) != RLX_OK)
            return st;
    }
    return RLX_OK;
}

static rlx_status load_normalizer(rlx_tokenizer *tok, const char *path, const cJSON *norm) {
    rlx_status st;
    if (!norm || cJSON_IsNull(norm))
        return RLX_OK;
    const char *type = type_of(norm);
    if (!type)
        return rlx_error(RLX_E_FORMAT, "%s: normalizer must be null or an object with a type", path);
    if (strcmp(type, "NFC") == 0)
        return add_step(tok, path, "normalizer", tok->norm, &tok->n_norm, TEXT_NORM_NFC, NULL, NULL);
    if (strcmp(type, "Prepend") == 0) {
        const char *prepend;
        if ((st = opt_string(path, "normalizer Prepend", norm, "prepend", &prepend)) != RLX_OK)
            return st;
        if (!prepend)
            return rlx_error(RLX_E_FORMAT, "%s: normalizer Prepend needs a 'prepend' string", path);
        return add_step(tok, path, "normalizer", tok->norm, &tok->n_norm, TEXT_NORM_PREPEND, prepend, NULL);
    }
    if (strcmp(type, "Replace") == 0) {
        const char *from, *to;
        if ((st = replace_pattern(path, "normalizer", norm, &from, &to)) != RLX_OK)
            return st;
        return add_step(tok, path, "normalizer", tok->norm, &tok->n_norm, TEXT_NORM_REPLACE, from, to);
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = get(norm, "normalizers");
        if (!cJSON_IsArray(list))
            return rlx_error(RLX_E_FORMAT, "%s: normalizer Sequence needs a 'normalizers' list", path);
        for (const cJSON *e = list->child; e; e = e->next)
            if ((st = load_normalizer(tok, path, e)) != RLX_OK)
                return st;
        return RLX_OK;
    }
    return rlx_error(RLX_E_UNSUPPORTED, "%s: normalizer '%s' is not supported (only NFC, Prepend, Replace, Sequence)",
                     path, type);
}

/* Oniguruma, which Hugging Face compiles these patterns with, matches Unicode White_Space with
 * \s. PCRE2's \s (with UCP) differs: it lacks U+0085 (NEL) and has U+180E (MONGOLIAN VOWEL
 * SEPARATOR). So \s and \S are spelled out as White_Space: outside a class as [...] and [^...],
 * inside one as its ranges. A \S inside a class cannot be spelled out that way and is left as it is. */
#define WHITE_SPACE                                                                                                    \
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static char *spell_out_space(const char *re) {
    size_t n = strlen(re);
    char *out = rlx__malloc(n * (sizeof WHITE_SPACE + 3) + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char e = re[++i];
            const char *rep = e == 's'                ? (in_class ? WHITE_SPACE : "[" WHITE_SPACE "]")
                              : e == 'S' && !in_class ? "[^" WHITE_SPACE "]"
                                                      : NULL;
            if (rep) {
                memcpy(out + o, rep, strlen(rep));
                o += strlen(rep);
            } else {
                out[o++] = '\\';
                out[o++] = e;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            out[o++] = c;
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && re[i + 1] == '^')
                out[o++] = re[++i];
            if (i + 1 < n && re[i + 1] == ']')
                out[o++] = re[++i];
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && re[i + 1] == ':') { /* [:alpha:] inside a class */
            const char *end = strstr(re + i + 2, ":]");
            if (end) {
                size_t len = (size_t)(end + 2 - (re + i));
                memcpy(out + o, re + i, len);
                o += len;
                i += len - 1;
                continue;
            }
        }
        if (in_class && c == ']')
            in_class = 0;
        out[o++] = c;
    }
    out[o] = '\0';
    return out;
}

rlx_status rlx__pretok_regex(rlx_tokenizer *tok, const char *path, const char *pattern, int literal) {
    char *widened = literal ? rlx__strdup(pattern) : spell_out_space(pattern);
    if (!widened)
        return rlx_error(RLX_E_NOMEM, "out of memory for a copy of the pre-tokenizer regex");
    int err;
    PCRE2_SIZE err_off;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    tok->re = pcre2_compile((PCRE2_SPTR)widened, PCRE2_ZERO_TERMINATED, opts, &err, &err_off, NULL);
    free(widened);
    if (!tok->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return rlx_error(RLX_E_FORMAT, "%s: pre-tokenizer regex does not compile: %s (near offset %zu of \"%s\")", path,
                         (const char *)msg, (size_t)err_off, pattern);
    }
    tok->re_jit = pcre2_jit_compile(tok->re, PCRE2_JIT_COMPLETE) == 0;
    for (size_t i = 0; i < rlx__n_pretok_names && !literal && !tok->pre_name; i++)
        if (strcmp(pattern, rlx__pretok_names[i].pattern) == 0)
            tok->pre_name = &rlx__pretok_names[i];
    return RLX_OK;
}

static rlx_status check_byte_level(const char *path, const cJSON *bl, int want_regex) {
    rlx_status st;
    int prefix, use_regex;
    if ((st = opt_bool(path, "pre_tokenizer ByteLevel", bl, "add_prefix_space", 1, &prefix)) != RLX_OK)
        return st;
    if ((st = opt_bool(path, "pre_tokenizer ByteLevel", bl, "use_regex", 1, &use_regex)) != RLX_OK)
        return st;
    if (prefix)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: ByteLevel pre-tokenizer with add_prefix_space is not supported", path);
    if (use_regex != want_regex)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: ByteLevel pre-tokenizer with use_regex %s is not supported here", path,
                         use_regex ? "true after a Split" : "false without a Split");
    return RLX_OK;
}

const char rlx__gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Qwen2's and Llama 3's split patterns, as their tokenizer.json files have them */
static const char qwen2_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen3.5's: Qwen2's with combining marks (\p{M}) inside words, as its tokenizer.json has it */
static const char qwen35_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
                                     "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char llama3_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const text_pretok_name rlx__pretok_names[] = {
    {"qwen2", qwen2_pattern, 1, 0, 0},       {"qwen35", qwen35_pattern, 1, 0, 0},
    {"llama-bpe", llama3_pattern, 0, 1, 1},  {"llama3", llama3_pattern, 0, 1, 1},
    {"llama-v3", llama3_pattern, 0, 1, 1},   {"gpt2", rlx__gpt2_pattern, 0, 0, 0},
    {"default", rlx__gpt2_pattern, 0, 0, 0},
};
const size_t rlx__n_pretok_names = sizeof rlx__pretok_names / sizeof rlx__pretok_names[0];

/* Metaspace: ' ' becomes the replacement character, prepended as prepend_scheme says (older files
 * have add_prefix_space instead: always or never), and with split every replacement starts a word. */
static rlx_status load_metaspace(rlx_tokenizer *tok, const char *path, const cJSON *ms) {
    rlx_status st;
    const char *rep, *scheme;
    int split, prefix;
    if ((st = opt_string(path, "pre_tokenizer Metaspace", ms, "replacement", &rep)) != RLX_OK ||
        (st = opt_string(path, "pre_tokenizer Metaspace", ms, "prepend_scheme", &scheme)) != RLX_OK ||
        (st = opt_bool(path, "pre_tokenizer Metaspace", ms, "split", 1, &split)) != RLX_OK ||
        (st = opt_bool(path, "pre_tokenizer Metaspace", ms, "add_prefix_space", 1, &prefix)) != RLX_OK)
        return st;
    size_t n = rep ? strlen(rep) : 0;
    if (!rep || n == 0 || n > 4 || rlx__utf8_check((const uint8_t *)rep, n) != n ||
        ((uint8_t)rep[0] < 0x80 && n != 1) ||
        ((uint8_t)rep[0] >= 0x80 && n != (size_t)((uint8_t)rep[0] >= 0xF0   ? 4
                                                  : (uint8_t)rep[0] >= 0xE0 ? 3
                                                                            : 2)))
        return rlx_error(RLX_E_FORMAT, "%s: pre_tokenizer Metaspace needs a one-character 'replacement'", path);
    memcpy(tok->ms_rep, rep, n);
    tok->ms_rep_len = (uint32_t)n;
    if (!scheme)
        tok->ms_prepend = prefix ? TEXT_PREPEND_ALWAYS : TEXT_PREPEND_NEVER;
    else if (strcmp(scheme, "always") == 0)
        tok->ms_prepend = TEXT_PREPEND_ALWAYS;
    else if (strcmp(scheme, "first") == 0)
        tok->ms_prepend = TEXT_PREPEND_FIRST;
    else if (strcmp(scheme, "never") == 0)
        tok->ms_prepend = TEXT_PREPEND_NEVER;
    else
        return rlx_error(RLX_E_FORMAT, "%s: pre_tokenizer Metaspace prepend_scheme '%s' (always, first or never)", path,
                         scheme);
    tok->metaspace = 1;
    tok->ms_split = split;
    return RLX_OK;
}

static rlx_status load_pre_tokenizer(rlx_tokenizer *tok, const char *path, const cJSON *pre) {
    rlx_status st;
    if (!pre || cJSON_IsNull(pre))
        return RLX_OK; /* each piece of text between added tokens is one word */
    const char *type = type_of(pre);
    if (!type)
        return rlx_error(RLX_E_FORMAT, "%s: pre_tokenizer must be an object with a type", path);
    if (strcmp(type, "ByteLevel") == 0) {
        if ((st = check_byte_level(path, pre, 1)) != RLX_OK)
            return st;
        tok->byte_level = 1;
        return rlx__pretok_regex(tok, path, rlx__gpt2_pattern, 0);
    }
    if (strcmp(type, "Metaspace") == 0)
        return load_metaspace(tok, path, pre);
    const cJSON *list = get(pre, "pretokenizers");
    if (strcmp(type, "Sequence") == 0 && cJSON_IsArray(list) && cJSON_GetArraySize(list) == 1)
        return load_pre_tokenizer(tok, path, list->child);
    if (strcmp(type, "Sequence") != 0 || !cJSON_IsArray(list) || cJSON_GetArraySize(list) != 2 ||
        !type_of(list->child) || strcmp(type_of(list->child), "Split") != 0 || !type_of(list->child->next) ||
        strcmp(type_of(list->child->next), "ByteLevel") != 0)
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: pre_tokenizer '%s' is not supported (only ByteLevel, Metaspace, or a Sequence of Split "
                         "and ByteLevel)",
                         path, type);
    const cJSON *split = list->child;
    if ((st = check_byte_level(path, list->child->next, 0)) != RLX_OK)
        return st;
    tok->byte_level = 1;
    const char *behavior;
    int invert;
    if ((st = opt_string(path, "pre_tokenizer Split", split, "behavior", &behavior)) != RLX_OK)
        return st;
    if ((st = opt_bool(path, "pre_tokenizer Split", split, "invert", 0, &invert)) != RLX_OK)
        return st;
    if (!behavior || strcmp(behavior, "Isolated") != 0 || invert)
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: Split pre-tokenizer with behavior '%s'%s is not supported (only Isolated)", path,
                         behavior ? behavior : "(none)", invert ? " and invert" : "");
    const cJSON *pattern = get(split, "pattern");
    const cJSON *regex = cJSON_IsObject(pattern) ? get(pattern, "Regex") : NULL;
    const cJSON *string = cJSON_IsObject(pattern) ? get(pattern, "String") : NULL;
    if (cJSON_IsString(regex))
        return rlx__pretok_regex(tok, path, regex->valuestring, 0);
    if (cJSON_IsString(string))
        return rlx__pretok_regex(tok, path, string->valuestring, 1);
    return rlx_error(RLX_E_FORMAT, "%s: Split pre-tokenizer needs a pattern {\"Regex\": ...} or {\"String\": ...}",
                     path);
}

static rlx_status check_model_options(rlx_tokenizer *tok, const char *path, const cJSON *model, const char **unk) {
    rlx_status st;
    const char *type = type_of(model);
    if (type && strcmp(type, "BPE") != 0)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", path, type);
    const cJSON *dropout = get(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout))
        return rlx_error(RLX_E_UNSUPPORTED, "%s: BPE dropout is not supported", path);
    if ((st = opt_bool(path, "model", model, "byte_fallback", 0, &tok->byte_fallback)) != RLX_OK ||
        (st = opt_bool(path, "model", model, "fuse_unk", 0, &tok->fuse_unk)) != RLX_OK ||
        (st = opt_string(path, "model", model, "unk_token", unk)) != RLX_OK)
        return st;
    const char *s;
    if ((st = opt_string(path, "model", model, "continuing_subword_prefix", &s)) != RLX_OK)
        return st;
    if (s && *s)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: BPE continuing_subword_prefix is not supported", path);
    if ((st = opt_string(path, "model", model, "end_of_word_suffix", &s)) != RLX_OK)
        return st;
    if (s && *s)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: BPE end_of_word_suffix is not supported", path);
    return RLX_OK;
}

/* One character (UTF-8, at most 4 bytes) of a decoder step into out. */
static rlx_status one_char(const char *path, const char *where, const char *s, char out[5], uint32_t *len) {
    size_t n = s ? strlen(s) : 0;
    size_t cl = 0;
    if (n > 0 && rlx__utf8_check((const uint8_t *)s, n) == n)
        rlx__utf8_decode((const uint8_t *)s, &cl);
    if (n == 0 || cl != n)
        return rlx_error(RLX_E_FORMAT, "%s: %s needs a one-character string", path, where);
    memcpy(out, s, n);
    out[n] = '\0';
    *len = (uint32_t)n;
    return RLX_OK;
}

/* What a decoder's steps have had so far: a Fuse (a Strip must follow one: it then strips the
 * whole text, not each token), a ByteLevel, any other step. */
typedef struct decoder_seen {
    int fused, byte_level, text;
} decoder_seen;

static rlx_status load_decoder_step(rlx_tokenizer *tok, const char *path, const cJSON *dec, decoder_seen *seen) {
    rlx_status st;
    const char *type = type_of(dec);
    if (!type)
        return rlx_error(RLX_E_FORMAT, "%s: decoder must be null or an object with a type", path);
    if (strcmp(type, "ByteLevel") == 0) {
        seen->byte_level = 1;
        return RLX_OK;
    }
    if (strcmp(type, "Sequence") != 0)
        seen->text = 1;
    if (strcmp(type, "Replace") == 0) {
        const char *from, *to;
        if ((st = replace_pattern(path, "decoder", dec, &from, &to)) != RLX_OK)
            return st;
        return add_step(tok, path, "decoder Replace", tok->dec_replace, &tok->n_dec_replace, TEXT_NORM_REPLACE, from,
                        to);
    }
    if (strcmp(type, "ByteFallback") == 0) {
        tok->dec_byte_fallback = 1;
        return RLX_OK;
    }
    if (strcmp(type, "Fuse") == 0) {
        seen->fused = 1;
        return RLX_OK;
    }
    if (strcmp(type, "Strip") == 0) {
        const char *content;
        const cJSON *start = get(dec, "start"), *stop = get(dec, "stop");
        int64_t n_start = 0, n_stop = 0;
        if ((st = opt_string(path, "decoder Strip", dec, "content", &content)) != RLX_OK)
            return st;
        if ((start && !rlx__json_int(start, &n_start)) || (stop && !rlx__json_int(stop, &n_stop)) || n_start < 0 ||
            n_start > 64 || n_stop < 0)
            return rlx_error(RLX_E_FORMAT, "%s: decoder Strip needs counts 'start' and 'stop' (0 to 64)", path);
        if (n_stop > 0 || !seen->fused)
            return rlx_error(RLX_E_UNSUPPORTED,
                             "%s: decoder Strip is supported only after a Fuse and with stop 0 (leading characters)",
                             path);
        tok->dec_strip = (uint32_t)n_start;
        return one_char(path, "decoder Strip content", content, tok->dec_strip_char, &tok->dec_strip_len);
    }
    if (strcmp(type, "Metaspace") == 0) {
        const char *rep, *scheme;
        int prefix;
        if ((st = opt_string(path, "decoder Metaspace", dec, "replacement", &rep)) != RLX_OK ||
            (st = opt_string(path, "decoder Metaspace", dec, "prepend_scheme", &scheme)) != RLX_OK ||
            (st = opt_bool(path, "decoder Metaspace", dec, "add_prefix_space", 1, &prefix)) != RLX_OK)
            return st;
        char c[5];
        uint32_t c_len = 0;
        if ((st = one_char(path, "decoder Metaspace replacement", rep, c, &c_len)) != RLX_OK)
            return st;
        tok->dec_metaspace_first = scheme ? strcmp(scheme, "never") != 0 : prefix;
        memcpy(tok->dec_ms_rep, c, sizeof c);
        tok->dec_ms_rep_len = c_len;
        return add_step(tok, path, "decoder Replace", tok->dec_replace, &tok->n_dec_replace, TEXT_NORM_REPLACE, c, " ");
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = get(dec, "decoders");
        if (!cJSON_IsArray(list))
            return rlx_error(RLX_E_FORMAT, "%s: decoder Sequence needs a 'decoders' list", path);
        for (const cJSON *e = list->child; e; e = e->next)
            if ((st = load_decoder_step(tok, path, e, seen)) != RLX_OK)
                return st;
        return RLX_OK;
    }
    return rlx_error(RLX_E_UNSUPPORTED,
                     "%s: decoder '%s' is not supported (only ByteLevel, Metaspace, Replace, ByteFallback, Fuse, "
                     "Strip and Sequence)",
                     path, type);
}

static rlx_status load_decoder(rlx_tokenizer *tok, const char *path, const cJSON *dec) {
    if (!dec || cJSON_IsNull(dec)) {
        if (!tok->byte_level) /* Hugging Face joins the tokens with spaces then */
            return rlx_error(RLX_E_UNSUPPORTED, "%s: a tokenizer without a decoder is not supported", path);
        tok->decode_kind = TEXT_DECODE_BYTE_LEVEL;
        return RLX_OK;
    }
    decoder_seen seen = {0};
    rlx_status st = load_decoder_step(tok, path, dec, &seen);
    if (st == RLX_OK && seen.byte_level && seen.text)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: a ByteLevel decoder combined with other decoders is not supported",
                         path);
    tok->decode_kind = seen.byte_level ? TEXT_DECODE_BYTE_LEVEL : TEXT_DECODE_TEXT;
    if (st == RLX_OK && tok->dec_metaspace_first && tok->n_dec_replace > 1)
        return rlx_error(RLX_E_UNSUPPORTED, "%s: a Metaspace decoder combined with Replace decoders is not supported",
                         path);
    return st;
}

// ---- vocabulary, added tokens, merges

/* The ids of the 256 single-byte tokens (ByteLevel) or <0xNN> tokens (byte fallback), and the
 * unknown token, once the vocabulary is in. */
void rlx__vocab_byte_tokens(rlx_tokenizer *tok, const char *unk) {
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    byte_level_tables(byte_to_cp, cp_to_byte);
    int all_bytes = 1;
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t n = utf8_put(byte_to_cp[b], s);
        int32_t byte_id = tok->byte_level ? rlx__vocab_find(tok, s, n) : -1;
        tok->byte_token[b] = byte_id >= 0 && tok->tokens[byte_id].in_model ? byte_id : -1;
        snprintf(s, sizeof s, "<0x%02X>", b);
        int32_t id = tok->byte_fallback ? rlx__vocab_find(tok, s, 6) : -1;
        tok->fallback_token[b] = id >= 0 && tok->tokens[id].in_model ? id : -1;
        all_bytes &= tok->byte_level ? tok->byte_token[b] >= 0 : tok->fallback_token[b] >= 0;
    }
    int32_t unk_id = unk ? rlx__vocab_find(tok, unk, strlen(unk)) : -1;
    tok->unk_id = unk_id >= 0 && tok->tokens[unk_id].in_model ? unk_id : -1;
    /* Every id then stands for at most max_token_bytes bytes of a word: ByteLevel words are raw
     * bytes, other words are spelled as the vocabulary is (an unknown token may stand for more). */
    tok->max_token_bytes = 0;
    if (!all_bytes)
        return;
    for (int32_t id = 0; id < tok->n_tokens; id++) {
        const text_token *t = &tok->tokens[id];
        uint32_t n = tok->byte_level ? t->bytes_len : t->str_len;
        if (t->present && t->in_model && n > tok->max_token_bytes)
            tok->max_token_bytes = n;
    }
}

/* "<0xNN>" with two hex digits, as tokenizers' ByteFallback decoder reads it: the byte, else -1. */
static int fallback_byte(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* What a TEXT decoder makes of token t (its string already set): its byte for a <0xNN> token
 * under ByteFallback, else the string with the decoder's Replace steps applied. */
static rlx_status token_text(rlx_tokenizer *tok, text_token *t) {
    rlx_status st;
    int byte = tok->dec_byte_fallback ? fallback_byte(tok->strings + t->str, t->str_len) : -1;
    if (byte >= 0) {
        char b = (char)byte;
        t->fallback = 1;
        t->bytes_len = 1;
        return rlx__arena_add(tok, &b, 1, &t->bytes);
    }
    t->fallback = 0;
    t->bytes = t->str;
    t->bytes_len = t->str_len;
    for (int i = 0; i < tok->n_dec_replace; i++) {
        const text_norm_step *r = &tok->dec_replace[i];
        char *out;
        size_t out_len;
        /* the arena may move while the result is added: the step works on a copy's offsets */
        if ((st = rlx__replace_all(tok->strings + t->bytes, t->bytes_len, tok->strings + r->a, r->a_len,
                                   tok->strings + r->b, r->b_len, &out, &out_len)) != RLX_OK)
            return st;
        if (out_len != t->bytes_len || memcmp(out, tok->strings + t->bytes, out_len) != 0)
            st = rlx__arena_add(tok, out, out_len, &t->bytes);
        t->bytes_len = (uint32_t)out_len;
        free(out);
        if (st != RLX_OK)
            return st;
    }
    return RLX_OK;
}

static rlx_status ensure_id(rlx_tokenizer *tok, int32_t id, size_t *cap) {
    if (id < tok->n_tokens)
        return RLX_OK;
    if ((size_t)id >= *cap) {
        size_t grown_cap = *cap ? *cap : 1024;
        while (grown_cap <= (size_t)id)
            grown_cap *= 2;
        text_token *grown = rlx__realloc(tok->tokens, grown_cap * sizeof *grown);
        if (!grown)
            return rlx_error(RLX_E_NOMEM, "cannot allocate %zu tokens", grown_cap);
        memset(grown + *cap, 0, (grown_cap - *cap) * sizeof *grown);
        tok->tokens = grown;
        *cap = grown_cap;
    }
    tok->n_tokens = id + 1;
    return RLX_OK;
}

rlx_status rlx__vocab_set(rlx_tokenizer *tok, const char *path, int32_t id, const char *str, size_t len, size_t *cap,
                          text_scratch *scratch) {
    rlx_status st;
    if ((st = ensure_id(tok, id, cap)) != RLX_OK)
        return st;
    text_token *t = &tok->tokens[id];
    if (t->present)
        return rlx_error(RLX_E_FORMAT, "%s: the vocabulary gives id %lld to both \"%.60s\" and \"%.*s\"", path,
                         (long long)id, tok->strings + t->str, (int)(len < 60 ? len : 60), str);
    if ((st = rlx__arena_add(tok, str, len, &t->str)) != RLX_OK)
        return st;
    t->str_len = (uint32_t)len;
    t->present = 1;
    t->in_model = 1;
    if (tok->decode_kind == TEXT_DECODE_TEXT)
        return token_text(tok, t);
    /* What ByteLevel decoding makes of it: each character's byte, or the raw UTF-8 when a
     * character is outside the byte-level alphabet (as tokenizers' ByteLevel decoder does). */
    if (scratch->cap < len + 1) {
        free(scratch->buf);
        scratch->cap = len + 64;
        if (!(scratch->buf = rlx__malloc(scratch->cap))) {
            scratch->cap = 0;
            return rlx_error(RLX_E_NOMEM, "out of memory");
        }
    }
    if (!scratch->tables) {
        uint32_t byte_to_cp[256];
        byte_level_tables(byte_to_cp, scratch->cp_to_byte);
        scratch->tables = 1;
    }
    const int16_t *cp_to_byte = scratch->cp_to_byte;
    size_t nb = 0, i = 0;
    int mapped = 1;
    while (i < len) {
        size_t cl;
        size_t window = len - i < 4 ? len - i : 4; /* checks the character at i only */
        if (rlx__utf8_check((const uint8_t *)str + i, window) == 0) {
            mapped = 0;
            break;
        }
        uint32_t cp = rlx__utf8_decode((const uint8_t *)str + i, &cl);
        if (cp >= 324 || cp_to_byte[cp] < 0) {
            mapped = 0;
            break;
        }
        scratch->buf[nb++] = (char)cp_to_byte[cp];
        i += cl;
    }
    if (mapped && (nb != len || memcmp(scratch->buf, str, len) != 0)) {
        if ((st = rlx__arena_add(tok, scratch->buf, nb, &t->bytes)) != RLX_OK)
            return st;
        t->bytes_len = (uint32_t)nb;
    } else { /* not byte-level, or decoding to itself (most ASCII words): no second copy */
        t->bytes = t->str;
        t->bytes_len = t->str_len;
    }
    return RLX_OK;
}

static rlx_status load_vocab(rlx_tokenizer *tok, const char *path, const cJSON *vocab, size_t *cap, int32_t *n_model) {
    if (!cJSON_IsObject(vocab))
        return rlx_error(RLX_E_FORMAT, "%s: model.vocab must be an object of token -> id", path);
    int32_t count = 0;
    text_scratch scratch = {0};
    rlx_status st = RLX_OK;
    for (const cJSON *e = vocab->child; e && st == RLX_OK; e = e->next) {
        int64_t id;
        if (!rlx__json_int(e, &id) || id < 0 || id >= RLX_TEXT_MAX_TOKENS)
            st = rlx_error(RLX_E_FORMAT, "%s: model.vocab[\"%.60s\"] must be an id in [0, %d)", path, e->string,
                           RLX_TEXT_MAX_TOKENS);
        else if ((st = rlx__vocab_set(tok, path, (int32_t)id, e->string, strlen(e->string), cap, &scratch)) == RLX_OK)
            count++;
    }
    free(scratch.buf);
    *n_model = count;
    return st;
}

rlx_status rlx__vocab_build_map(rlx_tokenizer *tok) {
    rlx_status st;
    free(tok->vocab_slots);
    tok->vocab_cap = pow2_at_least((size_t)tok->n_tokens * 3 / 2 + 16);
    tok->vocab_used = 0;
    tok->vocab_slots = rlx__calloc(tok->vocab_cap, sizeof *tok->vocab_slots);
    if (!tok->vocab_slots)
        return rlx_error(RLX_E_NOMEM, "cannot allocate the vocabulary map");
    for (int32_t id = 0; id < tok->n_tokens; id++)
        if (tok->tokens[id].present)
            if ((st = rlx__vocab_insert(tok, id)) != RLX_OK)
                return st;
    return RLX_OK;
}

static rlx_status merge_insert(rlx_tokenizer *tok, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = tok->merge_cap - 1;
    for (size_t i = rlx__merge_hash(key) & mask;; i = (i + 1) & mask) {
        if (tok->merge_keys[i] == UINT64_MAX) {
            tok->merge_keys[i] = key;
            tok->merge_rank[i] = rank;
            tok->merge_id[i] = id;
            return RLX_OK;
        }
        if (tok->merge_keys[i] == key) { /* a repeated pair takes its later rank, as a HashMap insert does */
            tok->merge_rank[i] = rank;
            tok->merge_id[i] = id;
            return RLX_OK;
        }
    }
}

rlx_status rlx__merges_alloc(rlx_tokenizer *tok, size_t n) {
    tok->merge_cap = pow2_at_least(n * 3 / 2 + 16);
    tok->merge_keys = rlx__malloc(tok->merge_cap * sizeof *tok->merge_keys);
    tok->merge_rank = rlx__malloc(tok->merge_cap * sizeof *tok->merge_rank);
    tok->merge_id = rlx__malloc(tok->merge_cap * sizeof *tok->merge_id);
    if (!tok->merge_keys || !tok->merge_rank || !tok->merge_id)
        return rlx_error(RLX_E_NOMEM, "cannot allocate the merge table for %zu merges", n);
    memset(tok->merge_keys, 0xFF, tok->merge_cap * sizeof *tok->merge_keys);
    return RLX_OK;
}

rlx_status rlx__merge_add(rlx_tokenizer *tok, const char *path, uint32_t rank, const char *left, size_t left_len,
                          const char *right, size_t right_len, text_scratch *scratch) {
    int32_t a = rlx__vocab_find(tok, left, left_len), b = rlx__vocab_find(tok, right, right_len);
    if (a < 0 || b < 0)
        return rlx_error(RLX_E_FORMAT, "%s: merge %u: token \"%.*s\" is not in the vocabulary", path, rank,
                         (int)(a < 0 ? left_len : right_len), a < 0 ? left : right);
    if (scratch->cap < left_len + right_len + 1) {
        free(scratch->buf);
        scratch->cap = (left_len + right_len) * 2 + 16;
        if (!(scratch->buf = rlx__malloc(scratch->cap))) {
            scratch->cap = 0;
            return rlx_error(RLX_E_NOMEM, "out of memory");
        }
    }
    memcpy(scratch->buf, left, left_len);
    memcpy(scratch->buf + left_len, right, right_len);
    int32_t merged = rlx__vocab_find(tok, scratch->buf, left_len + right_len);
    if (merged < 0)
        return rlx_error(RLX_E_FORMAT, "%s: merge %u: the merged token \"%.*s\" is not in the vocabulary", path, rank,
                         (int)(left_len + right_len), scratch->buf);
    return merge_insert(tok, a, b, rank, merged);
}

rlx_status rlx__merge_parse(const char *path, uint32_t rank, const char *s, size_t len, const char **left,
                            size_t *left_len, const char **right, size_t *right_len) {
    /* "a b": exactly one space, as the Rust reader splits it */
    const char *space = memchr(s, ' ', len);
    if (!space || memchr(space + 1, ' ', len - (size_t)(space + 1 - s)))
        return rlx_error(RLX_E_FORMAT, "%s: merge %u \"%.*s\" is not two tokens separated by one space", path, rank,
                         (int)(len < 60 ? len : 60), s);
    *left = s;
    *left_len = (size_t)(space - s);
    *right = space + 1;
    *right_len = len - *left_len - 1;
    return RLX_OK;
}

typedef struct score_merge {
    int32_t left, right, merged;
    float score;
} score_merge;

static int by_score_desc(const void *pa, const void *pb) {
    const score_merge *a = pa, *b = pb;
    /* NaN sorts last; equal scores keep a stable order by merged id */
    int an = a->score != a->score, bn = b->score != b->score;
    if (an != bn)
        return an - bn;
    if (!an && a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return (a->merged > b->merged) - (a->merged < b->merged);
}

rlx_status rlx__merges_from_scores(rlx_tokenizer *tok, const float *scores) {
    size_t n = 0, cap = 0;
    score_merge *m = NULL;
    rlx_status st = RLX_OK;
    for (int32_t id = 0; id < tok->n_tokens && st == RLX_OK; id++) {
        const text_token *t = &tok->tokens[id];
        if (!t->present || !t->in_model || t->str_len < 2)
            continue;
        const char *str = tok->strings + t->str;
        size_t cl;
        for (size_t k = 0; k < t->str_len; k += cl) {
            rlx__utf8_decode((const uint8_t *)str + k, &cl);
            if (k == 0)
                continue;
            int32_t a = rlx__vocab_find(tok, str, k), b = rlx__vocab_find(tok, str + k, t->str_len - k);
            if (a < 0 || b < 0 || !tok->tokens[a].in_model || !tok->tokens[b].in_model)
                continue;
            if (n == cap) {
                size_t grown_cap = cap ? cap * 2 : 4096;
                score_merge *grown = rlx__realloc(m, grown_cap * sizeof *grown);
                if (!grown) {
                    st = rlx_error(RLX_E_NOMEM, "cannot allocate %zu merges", grown_cap);
                    break;
                }
                m = grown;
                cap = grown_cap;
            }
            m[n++] = (score_merge){.left = a, .right = b, .merged = id, .score = scores[id]};
        }
    }
    if (st == RLX_OK)
        st = rlx__merges_alloc(tok, n);
    if (st == RLX_OK && n)
        qsort(m, n, sizeof *m, by_score_desc);
    uint32_t rank = 0;
    for (size_t i = 0; i < n && st == RLX_OK; i++) {
        if (i > 0 && by_score_desc(&(score_merge){.score = m[i - 1].score}, &(score_merge){.score = m[i].score}) != 0)
            rank++;
        st = merge_insert(tok, m[i].left, m[i].right, rank, m[i].merged);
    }
    free(m);
    return st;
}

static rlx_status load_merges(rlx_tokenizer *tok, const char *path, const cJSON *merges) {
    if (!cJSON_IsArray(merges))
        return rlx_error(RLX_E_FORMAT, "%s: model.merges must be a list", path);
    rlx_status st = rlx__merges_alloc(tok, (size_t)cJSON_GetArraySize(merges));
    text_scratch scratch = {0};
    uint32_t rank = 0;
    for (const cJSON *e = merges->child; e && st == RLX_OK; e = e->next, rank++) {
        const char *left = NULL, *right = NULL;
        size_t left_len = 0, right_len = 0;
        if (cJSON_IsString(e)) {
            st = rlx__merge_parse(path, rank, e->valuestring, strlen(e->valuestring), &left, &left_len, &right,
                                  &right_len);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            left = e->child->valuestring;
            left_len = strlen(left);
            right = e->child->next->valuestring;
            right_len = strlen(right);
        } else {
            st = rlx_error(RLX_E_FORMAT, "%s: merge %u must be a string \"a b\" or a pair [\"a\", \"b\"]", path, rank);
        }
        if (st == RLX_OK)
            st = rlx__merge_add(tok, path, rank, left, left_len, right, right_len, &scratch);
    }
    free(scratch.buf);
    return st;
}

/* AddedVocabulary::add_tokens for one token: a content already added is kept as it is; otherwise
 * the token takes its id from the model vocabulary if there, or the next id after both the
 * vocabulary and the added tokens. */
rlx_status rlx__added_token(rlx_tokenizer *tok, const added_spec *spec, int32_t n_model, size_t *cap,
                            size_t *added_cap) {
    rlx_status st;
    size_t len = strlen(spec->content);
    if (len == 0)
        return RLX_OK; /* tokenizers ignores empty added tokens */
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && memcmp(tok->strings + tok->added[i].off, spec->content, len) == 0)
            return RLX_OK;
    int32_t id = spec->id >= 0 ? spec->id : rlx__vocab_find(tok, spec->content, len);
    if (spec->id >= 0) {
        if ((st = ensure_id(tok, id, cap)) != RLX_OK)
            return st;
        const text_token *t = &tok->tokens[id];
        if (t->present && (t->str_len != len || memcmp(tok->strings + t->str, spec->content, len) != 0))
            return rlx_error(RLX_E_FORMAT, "added token \"%.60s\" has id %d, which \"%.60s\" already has",
                             spec->content, id, tok->strings + t->str);
    } else if (id < 0) {
        int32_t max = -1;
        for (size_t i = 0; i < tok->n_added; i++)
            if (tok->added[i].id > max)
                max = tok->added[i].id;
        id = max < 0 ? n_model : (max >= n_model || n_model == 0 ? max + 1 : n_model);
        while (id < tok->n_tokens && tok->tokens[id].present) /* a gap-free vocabulary never gets here */
            id++;
        if (id >= RLX_TEXT_MAX_TOKENS)
            return rlx_error(RLX_E_FORMAT, "too many tokens");
        if ((st = ensure_id(tok, id, cap)) != RLX_OK)
            return st;
    }
    if (tok->n_added == *added_cap) {
        size_t grown_cap = *added_cap ? *added_cap * 2 : 64;
        text_added *grown = rlx__realloc(tok->added, grown_cap * sizeof *grown);
        if (!grown)
            return rlx_error(RLX_E_NOMEM, "out of memory");
        tok->added = grown;
        *added_cap = grown_cap;
    }
    text_token *t = &tok->tokens[id];
    uint32_t off;
    if ((st = rlx__arena_add(tok, spec->content, len, &off)) != RLX_OK)
        return st;
    if (!t->present) {
        t->str = off;
        t->str_len = (uint32_t)len;
        t->present = 1;
        if ((st = rlx__vocab_insert(tok, id)) != RLX_OK)
            return st;
    }
    /* added tokens decode to their content, bypassing the ByteLevel decoder (a TEXT decoder's
     * steps apply to them as to any token) */
    t->bytes = off;
    t->bytes_len = (uint32_t)len;
    if (tok->decode_kind == TEXT_DECODE_TEXT && (st = token_text(tok, t)) != RLX_OK)
        return st;
    t->added = 1;
    t->special = (uint8_t)spec->special;
    text_added *a = &tok->added[tok->n_added++];
    *a = (text_added){.id = id,
                      .off = off,
                      .len = (uint32_t)len,
                      .special = (uint8_t)spec->special,
                      .lstrip = (uint8_t)spec->lstrip,
                      .rstrip = (uint8_t)spec->rstrip,
                      .single_word = (uint8_t)spec->single_word,
                      .normalized = (uint8_t)spec->normalized};
    return RLX_OK;
}

static rlx_status parse_added(const char *path, const char *where, const cJSON *obj, added_spec *spec) {
    rlx_status st;
    const char *content;
    if ((st = opt_string(path, where, obj, "content", &content)) != RLX_OK)
        return st;
    if (!content)
        return rlx_error(RLX_E_FORMAT, "%s: %s needs a 'content' string", path, where);
    spec->content = content;
    spec->id = -1;
    if ((st = opt_bool(path, where, obj, "special", 0, &spec->special)) != RLX_OK)
        return st;
    if ((st = opt_bool(path, where, obj, "lstrip", 0, &spec->lstrip)) != RLX_OK)
        return st;
    if ((st = opt_bool(path, where, obj, "rstrip", 0, &spec->rstrip)) != RLX_OK)
        return st;
    if ((st = opt_bool(path, where, obj, "single_word", 0, &spec->single_word)) != RLX_OK)
        return st;
    if ((st = opt_bool(path, where, obj, "normalized", !spec->special, &spec->normalized)) != RLX_OK)
        return st;
    return RLX_OK;
}

// ---- added-token matchers

static rlx_status build_matcher(rlx_tokenizer *tok, text_matcher *m, int normalized) {
    m->n = 0;
    m->items = rlx__malloc((tok->n_added + 1) * sizeof *m->items);
    if (!m->items)
        return rlx_error(RLX_E_NOMEM, "out of memory");
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].normalized == normalized)
            m->items[m->n++] = (uint32_t)i;
    /* insertion sort: qsort has no context argument, and there are few added tokens */
    for (size_t i = 1; i < m->n; i++) {
        uint32_t v = m->items[i];
        size_t j = i;
        while (j > 0) {
            const text_added *a = &tok->added[m->items[j - 1]], *b = &tok->added[v];
            uint8_t fa = (uint8_t)tok->strings[a->off], fb = (uint8_t)tok->strings[b->off];
            int after = fa > fb || (fa == fb && (a->len < b->len || (a->len == b->len && a->id > b->id)));
            if (!after)
                break;
            m->items[j] = m->items[j - 1];
            j--;
        }
        m->items[j] = v;
    }
    size_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < m->n && (uint8_t)tok->strings[tok->added[m->items[k]].off] < b)
            k++;
        m->first[b] = (uint32_t)k;
    }
    m->first[256] = (uint32_t)m->n;
    return RLX_OK;
}

// ---- tokenizer_config.json

/* A token given as "text" or {"content": "text", ...}; NULL when absent or null. */
static rlx_status config_token(const char *path, const cJSON *cfg, const char *key, const char **out) {
    const cJSON *item = get(cfg, key);
    *out = NULL;
    if (!item || cJSON_IsNull(item))
        return RLX_OK;
    if (cJSON_IsString(item)) {
        *out = item->valuestring;
        return RLX_OK;
    }
    const cJSON *content = cJSON_IsObject(item) ? get(item, "content") : NULL;
    if (!cJSON_IsString(content))
        return rlx_error(RLX_E_FORMAT, "%s: '%s' must be a string or an object with a 'content' string", path, key);
    *out = content->valuestring;
    return RLX_OK;
}

static rlx_status read_text_file(const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return RLX_OK;
        return rlx_error(RLX_E_IO, "%s: %s", path, strerror(errno));
    }
    char *buf = rlx__malloc(CHAT_TEMPLATE_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        return rlx_error(RLX_E_NOMEM, "out of memory");
    }
    size_t n = fread(buf, 1, CHAT_TEMPLATE_MAX_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > CHAT_TEMPLATE_MAX_BYTES) {
        free(buf);
        return rlx_error(bad ? RLX_E_IO : RLX_E_FORMAT, "%s: %s", path,
                         bad ? "read error" : "larger than 1 MiB, not a chat template");
    }
    buf[n] = '\0';
    *out = buf;
    return RLX_OK;
}

static rlx_status load_config(rlx_tokenizer *tok, const char *dir, int32_t n_model, size_t *cap, size_t *added_cap) {
    rlx_status try_st;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *cfg = NULL;
    if ((try_st = rlx__json_load(path, 1, &cfg)) != RLX_OK)
        return try_st;
    rlx_status st = RLX_OK;
    const char *tmpl = NULL;
    if (cfg) {
        if (!cJSON_IsObject(cfg)) {
            st = rlx_error(RLX_E_FORMAT, "%s: must be a JSON object", path);
            goto done;
        }
        /* Tokens tokenizer.json lacks, in id order, then special tokens named only here. */
        const cJSON *dec = get(cfg, "added_tokens_decoder");
        if (cJSON_IsObject(dec)) {
            int n = cJSON_GetArraySize(dec);
            const cJSON **order = rlx__calloc((size_t)n + 1, sizeof *order);
            long *keys = rlx__calloc((size_t)n + 1, sizeof *keys);
            if (!order || !keys) {
                free(order);
                free(keys);
                st = rlx_error(RLX_E_NOMEM, "out of memory");
                goto done;
            }
            int k = 0;
            for (const cJSON *e = dec->child; e; e = e->next, k++) {
                char *end;
                keys[k] = strtol(e->string, &end, 10);
                order[k] = e;
                for (int j = k; j > 0 && keys[j - 1] > keys[j]; j--) {
                    long tk = keys[j];
                    keys[j] = keys[j - 1];
                    keys[j - 1] = tk;
                    const cJSON *te = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = te;
                }
            }
            for (int i = 0; i < n && st == RLX_OK; i++) {
                added_spec spec;
                if (!cJSON_IsObject(order[i]))
                    st = rlx_error(RLX_E_FORMAT, "%s: added_tokens_decoder[\"%s\"] must be an object", path,
                                   order[i]->string);
                else if ((st = parse_added(path, "added_tokens_decoder entry", order[i], &spec)) == RLX_OK)
                    st = rlx__added_token(tok, &spec, n_model, cap, added_cap);
            }
            free(order);
            free(keys);
            if (st != RLX_OK)
                goto done;
        }
        static const char *const special_keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                   "pad_token", "cls_token", "mask_token"};
        for (size_t i = 0; i < sizeof special_keys / sizeof special_keys[0]; i++) {
            const char *content;
            if ((st = config_token(path, cfg, special_keys[i], &content)) != RLX_OK)
                goto done;
            if (content) {
                added_spec spec = {.content = content, .special = 1, .id = -1};
                if ((st = rlx__added_token(tok, &spec, n_model, cap, added_cap)) != RLX_OK)
                    goto done;
            }
        }
        const cJSON *extra = get(cfg, "additional_special_tokens");
        if (cJSON_IsArray(extra)) {
            for (const cJSON *e = extra->child; e; e = e->next) {
                added_spec spec = {.special = 1, .id = -1};
                if (cJSON_IsString(e))
                    spec.content = e->valuestring;
                else if (cJSON_IsObject(e) &&
                         (st = parse_added(path, "additional_special_tokens entry", e, &spec)) != RLX_OK)
                    goto done;
                if (spec.content && (st = rlx__added_token(tok, &spec, n_model, cap, added_cap)) != RLX_OK)
                    goto done;
            }
        }
        const char *names[3];
        if ((st = config_token(path, cfg, "eos_token", &names[0])) != RLX_OK ||
            (st = config_token(path, cfg, "pad_token", &names[1])) != RLX_OK ||
            (st = config_token(path, cfg, "bos_token", &names[2])) != RLX_OK)
            goto done;
        int32_t *ids[3] = {&tok->eos_id, &tok->pad_id, &tok->bos_id};
        for (int i = 0; i < 3; i++)
            *ids[i] = names[i] ? rlx__vocab_find(tok, names[i], strlen(names[i])) : -1;
        /* add_bos_token / add_eos_token, where given, decide what add_special puts around the text
         * (transformers rebuilds the post-processor from them), else the post-processor does */
        static const char *const add_keys[2] = {"add_bos_token", "add_eos_token"};
        for (int i = 0; i < 2; i++) {
            int add;
            const int32_t id = i == 0 ? tok->bos_id : tok->eos_id;
            if (!cJSON_IsBool(get(cfg, add_keys[i])))
                continue;
            if ((st = opt_bool(path, "config", cfg, add_keys[i], 0, &add)) != RLX_OK)
                goto done;
            if (add && id < 0) {
                st = rlx_error(RLX_E_FORMAT, "%s: %s is true but there is no %s token", path, add_keys[i],
                               i == 0 ? "bos" : "eos");
                goto done;
            }
            *(i == 0 ? &tok->n_prefix : &tok->n_suffix) = add ? 1 : 0;
            (i == 0 ? tok->prefix_ids : tok->suffix_ids)[0] = id;
        }

        const cJSON *ct = get(cfg, "chat_template");
        if (cJSON_IsString(ct)) {
            tmpl = ct->valuestring;
        } else if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": ...}, ...] */
            for (const cJSON *e = ct->child; e; e = e->next) {
                const cJSON *name = get(e, "name"), *t = get(e, "template");
                if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0 && cJSON_IsString(t))
                    tmpl = t->valuestring;
                if (cJSON_IsString(name) && strcmp(name->valuestring, "tool_use") == 0 && cJSON_IsString(t) &&
                    !tok->chat_template_tool_use && !(tok->chat_template_tool_use = rlx__strdup(t->valuestring))) {
                    st = rlx_error(RLX_E_NOMEM, "out of memory");
                    goto done;
                }
            }
        } else if (ct && !cJSON_IsNull(ct)) {
            st = rlx_error(RLX_E_FORMAT, "%s: chat_template must be a string or a list of named templates", path);
            goto done;
        }
    }
    if (tmpl) {
        if (!(tok->chat_template = rlx__strdup(tmpl))) {
            st = rlx_error(RLX_E_NOMEM, "out of memory");
            goto done;
        }
    } else {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        if ((st = read_text_file(path, &tok->chat_template)) != RLX_OK)
            goto done;
    }
    tok->chat_kind = tok->chat_template ? rlx__chat_template_kind(tok->chat_template) : RLX_CHAT_TEMPLATE_NONE;
done:
    cJSON_Delete(cfg);
    return st;
}

// ---- load

/* One post-processor: what encoding with add_special puts around a single sequence. */
static rlx_status load_post_processor(rlx_tokenizer *tok, const char *path, const cJSON *pp) {
    rlx_status st;
    if (!pp || cJSON_IsNull(pp))
        return RLX_OK;
    const char *type = type_of(pp);
    if (!type)
        return rlx_error(RLX_E_FORMAT, "%s: post_processor must be null or an object with a type", path);
    if (strcmp(type, "ByteLevel") == 0) /* offsets only */
        return RLX_OK;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = get(pp, "processors");
        if (!cJSON_IsArray(list))
            return rlx_error(RLX_E_FORMAT, "%s: post_processor Sequence needs a 'processors' list", path);
        for (const cJSON *e = list->child; e; e = e->next)
            if ((st = load_post_processor(tok, path, e)) != RLX_OK)
                return st;
        return RLX_OK;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%s: post_processor '%s' is not supported (only TemplateProcessing, ByteLevel, Sequence)",
                         path, type);
    const cJSON *single = get(pp, "single"), *specials = get(pp, "special_tokens");
    if (!cJSON_IsArray(single))
        return rlx_error(RLX_E_FORMAT, "%s: post_processor TemplateProcessing needs a 'single' list", path);
    tok->n_prefix = tok->n_suffix = 0;
    int seen_a = 0;
    for (const cJSON *e = single->child; e; e = e->next) {
        const cJSON *seq = cJSON_IsObject(e) ? get(e, "Sequence") : NULL;
        const cJSON *sp = cJSON_IsObject(e) ? get(e, "SpecialToken") : NULL;
        const cJSON *name = sp ? get(sp, "id") : seq ? get(seq, "id") : NULL;
        if (!cJSON_IsString(name))
            return rlx_error(RLX_E_FORMAT,
                             "%s: post_processor TemplateProcessing: a 'single' item must be a "
                             "Sequence or a SpecialToken with an id",
                             path);
        if (seq) {
            if (strcmp(name->valuestring, "A") != 0 || seen_a)
                return rlx_error(RLX_E_UNSUPPORTED,
                                 "%s: post_processor TemplateProcessing 'single' must hold sequence A once", path);
            seen_a = 1;
            continue;
        }
        const cJSON *entry = cJSON_IsObject(specials) ? get(specials, name->valuestring) : NULL;
        const cJSON *ids = entry ? get(entry, "ids") : NULL;
        if (!cJSON_IsArray(ids))
            return rlx_error(RLX_E_FORMAT, "%s: post_processor TemplateProcessing: special token '%.60s' has no ids",
                             path, name->valuestring);
        for (const cJSON *i = ids->child; i; i = i->next) {
            int64_t id;
            int *n = seen_a ? &tok->n_suffix : &tok->n_prefix;
            int32_t *dst = seen_a ? tok->suffix_ids : tok->prefix_ids;
            if (!rlx__json_int(i, &id) || id < 0 || id >= RLX_TEXT_MAX_TOKENS)
                return rlx_error(RLX_E_FORMAT, "%s: post_processor TemplateProcessing: bad id for '%.60s'", path,
                                 name->valuestring);
            if (*n == 4)
                return rlx_error(RLX_E_UNSUPPORTED,
                                 "%s: post_processor TemplateProcessing adds more than 4 ids on "
                                 "one side",
                                 path);
            dst[(*n)++] = (int32_t)id;
        }
    }
    if (!seen_a)
        return rlx_error(RLX_E_FORMAT, "%s: post_processor TemplateProcessing 'single' lacks sequence A", path);
    return RLX_OK;
}

static rlx_status load_tokenizer_json(rlx_tokenizer *tok, const char *path, const cJSON *root, size_t *cap,
                                      size_t *added_cap, int32_t *n_model) {
    rlx_status st;
    if (!cJSON_IsObject(root))
        return rlx_error(RLX_E_FORMAT, "%s: must be a JSON object", path);
    const cJSON *model = get(root, "model");
    if (!cJSON_IsObject(model))
        return rlx_error(RLX_E_FORMAT, "%s: missing the 'model' object", path);
    const char *unk = NULL;
    if ((st = check_model_options(tok, path, model, &unk)) != RLX_OK)
        return st;
    int ignore_merges;
    if ((st = opt_bool(path, "model", model, "ignore_merges", 0, &ignore_merges)) != RLX_OK)
        return st;
    tok->ignore_merges = ignore_merges;
    if ((st = load_normalizer(tok, path, get(root, "normalizer"))) != RLX_OK)
        return st;
    if ((st = load_pre_tokenizer(tok, path, get(root, "pre_tokenizer"))) != RLX_OK)
        return st;
    if ((st = load_decoder(tok, path, get(root, "decoder"))) != RLX_OK)
        return st;
    if ((st = load_post_processor(tok, path, get(root, "post_processor"))) != RLX_OK)
        return st;

    if ((st = load_vocab(tok, path, get(model, "vocab"), cap, n_model)) != RLX_OK)
        return st;
    if ((st = rlx__vocab_build_map(tok)) != RLX_OK)
        return st;
    if ((st = load_merges(tok, path, get(model, "merges"))) != RLX_OK)
        return st;
    rlx__vocab_byte_tokens(tok, unk);

    const cJSON *added = get(root, "added_tokens");
    if (added && !cJSON_IsNull(added)) {
        if (!cJSON_IsArray(added))
            return rlx_error(RLX_E_FORMAT, "%s: added_tokens must be a list", path);
        int index = 0;
        for (const cJSON *e = added->child; e; e = e->next, index++) {
            char where[48];
            snprintf(where, sizeof where, "added_tokens[%d]", index);
            if (!cJSON_IsObject(e))
                return rlx_error(RLX_E_FORMAT, "%s: %s must be an object", path, where);
            added_spec spec;
            if ((st = parse_added(path, where, e, &spec)) != RLX_OK)
                return st;
            if ((st = rlx__added_token(tok, &spec, *n_model, cap, added_cap)) != RLX_OK)
                return st;
        }
    }
    return RLX_OK;
}

/* The token table and the string arena grew by doubling (and the table's new part was zeroed,
 * so it is resident): cut both to what they hold, which nothing adds to after loading. A failed
 * shrink keeps the larger block. */
static void compact(rlx_tokenizer *tok) {
    text_token *tokens = tok->n_tokens ? rlx__realloc(tok->tokens, (size_t)tok->n_tokens * sizeof *tokens) : NULL;
    if (tokens)
        tok->tokens = tokens;
    char *strings = tok->strings_len ? rlx__realloc(tok->strings, tok->strings_len) : NULL;
    if (strings) {
        tok->strings = strings;
        tok->strings_cap = tok->strings_len;
    }
}

/* The tokenizer of model_dir, or of g (an open GGUF model's header, model_dir its path). */
static rlx_status open_tokenizer(const char *model_dir, const struct rlx__gguf *g, rlx_tokenizer **out) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer.json", model_dir) >= sizeof path)
        return rlx_error(RLX_E_INVALID, "model directory path too long");
    rlx_tokenizer *tok = rlx__calloc(1, sizeof *tok);
    if (!tok)
        return rlx_error(RLX_E_NOMEM, "cannot allocate a tokenizer");
    tok->eos_id = tok->pad_id = tok->bos_id = tok->unk_id = -1;
    rlx_status st = rlx__cache_init(&tok->cache);
    if (st != RLX_OK) {
        free(tok);
        return st;
    }
    cJSON *root = NULL;
    size_t cap = 0, added_cap = 0;
    int32_t n_model = 0;
    /* a file can only be a GGUF model; "FILE/tokenizer.json: Not a directory" would not say what
     * is wrong with it */
    int gguf = g != NULL;
    if (!g && (st = rlx__weights_path_is_gguf(model_dir, &gguf)) != RLX_OK)
        goto fail;
    if (gguf) {
        if ((st = rlx__tokenizer_load_gguf(tok, model_dir, g, &cap, &added_cap)) != RLX_OK)
            goto fail;
    } else {
        if ((st = rlx__json_load(path, 0, &root)) != RLX_OK)
            goto fail;
        st = load_tokenizer_json(tok, path, root, &cap, &added_cap, &n_model);
        cJSON_Delete(root);
        if (st != RLX_OK)
            goto fail;
        if ((st = load_config(tok, model_dir, n_model, &cap, &added_cap)) != RLX_OK)
            goto fail;
    }
    /* Normalized added tokens are matched against normalized text, so their content is normalized
     * (AddedVocabulary::refresh_added_tokens). */
    tok->nfc = tok->n_norm == 1 && tok->norm[0].kind == TEXT_NORM_NFC;
    for (size_t i = 0; i < tok->n_added && tok->n_norm; i++) {
        text_added *a = &tok->added[i];
        if (!a->normalized)
            continue;
        char *norm;
        size_t norm_len;
        if ((st = rlx__normalize(tok, tok->strings + a->off, a->len, &norm, &norm_len)) != RLX_OK)
            goto fail;
        st = rlx__arena_add(tok, norm, norm_len, &a->off);
        a->len = (uint32_t)norm_len;
        free(norm);
        if (st != RLX_OK)
            goto fail;
    }
    for (int i = 0; i < tok->n_prefix + tok->n_suffix; i++) {
        int32_t id = i < tok->n_prefix ? tok->prefix_ids[i] : tok->suffix_ids[i - tok->n_prefix];
        if (id < 0 || id >= tok->n_tokens || !tok->tokens[id].present) {
            st = rlx_error(RLX_E_FORMAT, "%s: the post-processor adds id %d, which has no token", model_dir, id);
            goto fail;
        }
    }
    if ((st = build_matcher(tok, &tok->raw_matcher, 0)) != RLX_OK ||
        (st = build_matcher(tok, &tok->norm_matcher, 1)) != RLX_OK)
        goto fail;
    compact(tok);
    *out = tok;
    return RLX_OK;
fail:
    rlx_tokenizer_close(tok);
    return st;
}

rlx_status rlx_tokenizer_open(const char *model_dir, rlx_tokenizer **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_tokenizer_open: out is NULL");
    *out = NULL;
    if (!model_dir)
        return rlx_error(RLX_E_INVALID, "rlx_tokenizer_open: model_dir is NULL");
    return open_tokenizer(model_dir, NULL, out);
}

rlx_status rlx_tokenizer_open_model(const rlx_model *model, rlx_tokenizer **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_tokenizer_open_model: out is NULL");
    *out = NULL;
    if (!model)
        return rlx_error(RLX_E_INVALID, "rlx_tokenizer_open_model: model is NULL");
    return open_tokenizer(rlx_model_dir(model), rlx__weights_gguf(rlx_model_weights(model)), out);
}

void rlx_tokenizer_close(rlx_tokenizer *tok) {
    if (!tok)
        return;
    free(tok->tokens);
    free(tok->strings);
    free(tok->vocab_slots);
    free(tok->merge_keys);
    free(tok->merge_rank);
    free(tok->merge_id);
    pcre2_code_free(tok->re);
    free(tok->added);
    free(tok->raw_matcher.items);
    free(tok->norm_matcher.items);
    free(tok->chat_template);
    free(tok->chat_template_tool_use);
    rlx__cache_deinit(&tok->cache);
    free(tok);
}

// ---- accessors

int32_t rlx_tokenizer_vocab_size(const rlx_tokenizer *tok) { return tok ? tok->n_tokens : 0; }

int32_t rlx_tokenizer_token_id(const rlx_tokenizer *tok, const char *token) {
    if (!tok || !token)
        return rlx_error(RLX_E_INVALID, "rlx_tokenizer_token_id: NULL argument");
    int32_t id = rlx__vocab_find(tok, token, strlen(token));
    if (id < 0)
        return rlx_error(RLX_E_NOT_FOUND, "token \"%.80s\" is not in the vocabulary", token);
    return id;
}

const char *rlx_tokenizer_token_text(const rlx_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_tokens || !tok->tokens[id].present)
        return NULL;
    return tok->strings + tok->tokens[id].str;
}

int rlx_tokenizer_is_special(const rlx_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_tokens)
        return 0;
    return tok->tokens[id].special;
}

int32_t rlx_tokenizer_eos_id(const rlx_tokenizer *tok) { return tok ? tok->eos_id : -1; }

int32_t rlx_tokenizer_pad_id(const rlx_tokenizer *tok) { return tok ? tok->pad_id : -1; }

int32_t rlx_tokenizer_bos_id(const rlx_tokenizer *tok) { return tok ? tok->bos_id : -1; }

rlx_chat_template_kind rlx_chat_template_of(const rlx_tokenizer *tok) {
    return tok ? tok->chat_kind : RLX_CHAT_TEMPLATE_NONE;
}

const char *rlx_chat_template_text(const rlx_tokenizer *tok) { return tok ? tok->chat_template : NULL; }
