/* The tokenizer's layout, shared by the sources of core/src/text. */
#ifndef RLX_TEXT_INTERNAL_H
#define RLX_TEXT_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "rlx/text.h"

/* Words longer than this (in bytes) skip the word cache; the cache stops growing at its cap. */
#define TEXT_CACHE_MAX_WORD 256
#define TEXT_CACHE_MAX_ENTRIES 65536

typedef struct text_token {
    uint32_t str; /* offset of the vocabulary string (NUL-terminated) in strings */
    uint32_t str_len;
    uint32_t bytes; /* offset of the bytes it decodes to in strings */
    uint32_t bytes_len;
    uint8_t present;  /* 0 for a gap in the id space */
    uint8_t in_model; /* in the BPE model's vocab (not only an added token) */
    uint8_t added;
    uint8_t special;
} text_token;

typedef struct text_added {
    int32_t id;
    uint32_t off, len; /* content in strings; NFC'd for a normalized token when the normalizer is NFC */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} text_added;

/* Leftmost-longest matcher over a set of added tokens (Hugging Face uses an Aho-Corasick
 * automaton in LeftmostLongest mode; a first-byte filter plus candidates sorted longest first
 * finds the same matches for the few dozen tokens models have). */
typedef struct text_matcher {
    uint32_t *items; /* indexes into tok->added, by first byte, then length descending */
    size_t n;
    uint32_t first[257]; /* items[first[b] .. first[b+1]) start with byte b */
} text_matcher;

typedef struct text_cache {
    pthread_mutex_t lock;
    uint64_t *hashes;  /* per slot */
    uint32_t *entries; /* per slot: 0 = empty, else entry index + 1 */
    size_t cap;
    /* entry i: key bytes at data[key_off[i] ...] of key_len[i], ids after it */
    uint32_t *key_off, *key_len, *n_ids;
    size_t n, n_alloc;
    uint8_t *data;
    size_t data_len, data_cap;
} text_cache;

struct rlx_tokenizer {
    text_token *tokens; /* [n_tokens] indexed by id */
    int32_t n_tokens;
    char *strings;
    size_t strings_len, strings_cap;

    /* vocabulary string -> id (over tokens[]): hash high half << 32 | id + 1; vocab_used of
     * vocab_cap slots are taken, at most two thirds (vocab.c) */
    uint64_t *vocab_slots;
    size_t vocab_cap, vocab_used;

    /* merge (left id, right id) -> rank and merged id; at most two thirds full (the count is
     * known before the table is made) */
    uint64_t *merge_keys; /* UINT64_MAX = empty */
    uint32_t *merge_rank;
    int32_t *merge_id;
    size_t merge_cap;

    int32_t byte_token[256]; /* id of the single-byte token of each byte */
    /* The most bytes one token of the BPE model stands for, when every byte has a token (else
     * 0): a word of n bytes then merges into at least n / max_token_bytes ids. */
    uint32_t max_token_bytes;
    int ignore_merges;
    int nfc;

    pcre2_code *re;
    int re_jit;

    text_added *added;
    size_t n_added;
    text_matcher raw_matcher, norm_matcher;

    int32_t eos_id, pad_id, bos_id;
    char *chat_template;
    char *chat_template_tool_use; /* the "tool_use" one of a list of named templates, or NULL */
    rlx_chat_template_kind chat_kind;

    text_cache cache;
};

/* ---- shared helpers ---- */

/* Hash of a merge's key (left id << 32 | right id), used by the loader and the encoder alike. */
static inline uint64_t rlx__merge_hash(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ULL;
    return key ^ (key >> 31);
}

/* Byte offset of the first invalid UTF-8 sequence in s[0, len), or len when s is valid
 * (overlong forms, surrogates and code points above U+10FFFF are invalid). */
size_t rlx__utf8_check(const uint8_t *s, size_t len);

/* Decodes the code point at s (valid UTF-8 of at least one character); stores its length. */
uint32_t rlx__utf8_decode(const uint8_t *s, size_t *n);

/* White_Space (Rust's char::is_whitespace, Oniguruma's \s). */
int rlx__unicode_is_space(uint32_t c);

/* NFC of s[0, len) into a malloc'd buffer; RLX_E_NOMEM or RLX_E_INTERNAL on failure. */
rlx_status rlx__nfc(const char *s, size_t len, char **out, size_t *out_len);

/* Looks a vocabulary string up; -1 when absent. */
int32_t rlx__vocab_find(const rlx_tokenizer *tok, const char *s, size_t len);
/* Adds token id (its string already in tok->strings) to the map, growing it to stay at most two
 * thirds full (vocab.c). */
rlx_status rlx__vocab_insert(rlx_tokenizer *tok, int32_t id);

/* The encoder's word cache. */
rlx_status rlx__cache_init(text_cache *c);
void rlx__cache_deinit(text_cache *c);

/* Whether the Jinja engine parses a chat template (RLX_CHAT_TEMPLATE_JINJA or _UNKNOWN). */
rlx_chat_template_kind rlx__chat_template_kind(const char *tmpl);

/* Token ids are below this (tokenizer.json and GGUF vocabularies alike). */
#define RLX_TEXT_MAX_TOKENS (1 << 24)

/* A growable byte buffer reused across calls, and the byte-level alphabet once computed. */
typedef struct text_scratch {
    char *buf;
    size_t cap;
    int tables;
    int16_t cp_to_byte[324];
} text_scratch;

/* Loading steps shared by the tokenizer.json and GGUF readers (tokenizer.c). path names the file
 * in errors; cap is the capacity of tok->tokens. */
rlx_status rlx__vocab_set(rlx_tokenizer *tok, const char *path, int32_t id, const char *str, size_t len, size_t *cap,
                          text_scratch *scratch);
rlx_status rlx__vocab_build_map(rlx_tokenizer *tok);
void rlx__vocab_byte_tokens(rlx_tokenizer *tok);
rlx_status rlx__merges_alloc(rlx_tokenizer *tok, size_t n);
/* Splits merge "a b" (exactly one space) of len bytes into its two tokens. */
rlx_status rlx__merge_parse(const char *path, uint32_t rank, const char *s, size_t len, const char **left,
                            size_t *left_len, const char **right, size_t *right_len);
rlx_status rlx__merge_add(rlx_tokenizer *tok, const char *path, uint32_t rank, const char *left, size_t left_len,
                          const char *right, size_t right_len, text_scratch *scratch);

/* GPT-2's pattern, which a ByteLevel pre-tokenizer with use_regex applies. */
extern const char rlx__gpt2_pattern[];

/* Compiles the pre-tokenizer's split pattern (a regex, or a literal string). */
rlx_status rlx__pretok_regex(rlx_tokenizer *tok, const char *path, const char *pattern, int literal);

/* One added token as tokenizer.json (or a GGUF vocabulary) describes it; id -1 lets the loader
 * choose as Hugging Face's AddedVocabulary does. */
typedef struct added_spec {
    const char *content; /* NUL-terminated */
    int special, lstrip, rstrip, single_word, normalized;
    int32_t id;
} added_spec;

/* AddedVocabulary::add_tokens for one token (n_model: the model vocabulary's size; cap and
 * added_cap: capacities of tok->tokens and tok->added). */
rlx_status rlx__added_token(rlx_tokenizer *tok, const added_spec *spec, int32_t n_model, size_t *cap,
                            size_t *added_cap);

/* Loads the vocabulary, merges, added tokens, special ids and chat template of a GGUF file's
 * tokenizer.ggml.* metadata (tokenizer_gguf.c): from g, a header the caller parsed (an open
 * model's), else from the file at path, parsed for the call. */
struct rlx__gguf;
rlx_status rlx__tokenizer_load_gguf(rlx_tokenizer *tok, const char *path, const struct rlx__gguf *g, size_t *cap,
                                    size_t *added_cap);

#endif
