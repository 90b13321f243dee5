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
    uint8_t present : 1;  /* 0 for a gap in the id space */
    uint8_t in_model : 1; /* in the BPE model's vocab (not only an added token) */
    uint8_t added : 1;
    uint8_t special : 1;
    uint8_t fallback : 1; /* a <0xNN> token that a ByteFallback decoder turns into its byte (in bytes) */
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

/* One step of the normalizer, in order: NFC, Prepend (prepend a string to non-empty text) or
 * Replace (every occurrence of a string by another); strings are offsets into tok->strings. */
typedef enum { TEXT_NORM_NFC, TEXT_NORM_PREPEND, TEXT_NORM_REPLACE } text_norm_kind;
typedef struct text_norm_step {
    text_norm_kind kind;
    uint32_t a, a_len, b, b_len; /* Prepend: a; Replace: a -> b */
} text_norm_step;
#define TEXT_MAX_NORM_STEPS 8

/* Metaspace pre-tokenizer's prepend_scheme. */
typedef enum { TEXT_PREPEND_NEVER, TEXT_PREPEND_FIRST, TEXT_PREPEND_ALWAYS } text_prepend;

/* How ids become text. BYTE_LEVEL: each token stands for the bytes of its characters in GPT-2's
 * byte alphabet. TEXT: a token is its string with the decoder's Replace steps (or Metaspace's
 * replacement character as a space) applied, precomputed as its bytes. */
typedef enum { TEXT_DECODE_BYTE_LEVEL, TEXT_DECODE_TEXT } text_decode_kind;

/* The byte-level pre-tokenizers llama.cpp names in tokenizer.ggml.pre: the split regex of the
 * tokenizer.json each stands for, whether that file normalizes to NFC, sets ignore_merges, and
 * whether llama.cpp adds a BOS by default. The GGUF reader goes from name to pattern, the GGUF
 * writer from pattern to name (the first entry of a pattern is its usual name). */
typedef struct text_pretok_name {
    const char *name, *pattern;
    int nfc, ignore_merges, add_bos;
} text_pretok_name;
extern const text_pretok_name rlx__pretok_names[];
extern const size_t rlx__n_pretok_names;

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

    /* The ByteLevel pre-tokenizer: words are merged from their bytes (byte_token); without it,
     * from their characters as the vocabulary spells them (SentencePiece-style vocabularies). */
    int byte_level;
    int32_t byte_token[256];     /* id of the single-byte token of each byte */
    int byte_fallback;           /* BPE byte_fallback: a character not in the vocabulary becomes <0xNN> tokens */
    int32_t fallback_token[256]; /* id of <0xNN> in the model vocabulary, or -1 */
    int32_t unk_id;              /* the model's unk_token, -1 when none */
    int fuse_unk;
    /* The most bytes one token of the BPE model stands for, when every byte has a token (else
     * 0): a word of n bytes then merges into at least n / max_token_bytes ids. */
    uint32_t max_token_bytes;
    int ignore_merges;
    int nfc; /* the normalizer is NFC alone (the fast path of the common byte-level tokenizers) */
    text_norm_step norm[TEXT_MAX_NORM_STEPS];
    int n_norm;

    /* Metaspace pre-tokenizer: ' ' becomes the replacement (ms_rep, UTF-8), which is prepended
     * as prepend_scheme says, and with ms_split every replacement starts a word */
    int metaspace, ms_split;
    text_prepend ms_prepend;
    char ms_rep[5];
    uint32_t ms_rep_len;

    text_decode_kind decode_kind;
    int dec_byte_fallback; /* runs of <0xNN> tokens become their bytes, or one U+FFFD a byte if not UTF-8 */
    uint32_t dec_strip;    /* Strip after Fuse: up to this many leading dec_strip_char are dropped */
    char dec_strip_char[5];
    uint32_t dec_strip_len;
    int dec_metaspace_first; /* Metaspace decoder: the first token's dec_ms_rep characters vanish */
    char dec_ms_rep[5];
    uint32_t dec_ms_rep_len;
    text_norm_step dec_replace[TEXT_MAX_NORM_STEPS]; /* the decoder's Replace steps, in order */
    int n_dec_replace;

    /* what encoding with add_special puts around the text (the post-processor's single template,
     * or add_bos_token / add_eos_token) */
    int32_t prefix_ids[4], suffix_ids[4];
    int n_prefix, n_suffix;

    pcre2_code *re;
    int re_jit;
    const text_pretok_name *pre_name; /* the regex is one llama.cpp names, or NULL */

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
/* Token id's bytes as decoding it in the middle of a text gives them (ByteLevel's bytes, an added
 * token's content, a TEXT decoder's Replace steps applied, a <0xNN> byte token's byte; not what
 * a Strip or Metaspace decoder does to the first token), borrowed from tok: 1 when it is a
 * special added token, 0 for any other token, -1 for an id with no token (bytes untouched). */
int rlx__token_bytes(const rlx_tokenizer *tok, int32_t id, const char **bytes, size_t *len);
/* Adds token id (its string already in tok->strings) to the map, growing it to stay at most two
 * thirds full (vocab.c). */
rlx_status rlx__vocab_insert(rlx_tokenizer *tok, int32_t id);

/* The encoder's word cache. */
rlx_status rlx__cache_init(text_cache *c);
void rlx__cache_deinit(text_cache *c);

/* Whether the Jinja engine parses a chat template (RLX_CHAT_TEMPLATE_JINJA or _UNKNOWN). */
rlx_chat_template_kind rlx__chat_template_kind(const char *tmpl);

/* s[0, len) with every occurrence of from (scanned left to right) replaced by to, into a malloc'd
 * NUL-terminated buffer. */
rlx_status rlx__replace_all(const char *s, size_t len, const char *from, size_t from_len, const char *to, size_t to_len,
                            char **out, size_t *out_len);

/* Applies the normalizer (tok->norm) to s[0, len) into a malloc'd buffer. */
rlx_status rlx__normalize(const rlx_tokenizer *tok, const char *s, size_t len, char **out, size_t *out_len);

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
/* Strings kept for the life of the tokenizer (normalizer arguments and the like). */
rlx_status rlx__arena_add(rlx_tokenizer *tok, const char *s, size_t len, uint32_t *off);
/* SentencePiece's BPE from token scores (a GGUF 'llama' vocabulary has no merges): every model
 * token that is the concatenation of two model tokens is their merge, ranked by its score,
 * highest first (equal scores share a rank and the leftmost pair wins, as llama.cpp's
 * llm_tokenizer_spm does). scores[id] for each id. */
rlx_status rlx__merges_from_scores(rlx_tokenizer *tok, const float *scores);
rlx_status rlx__vocab_build_map(rlx_tokenizer *tok);
/* unk: the model's unk_token (NULL when none). */
void rlx__vocab_byte_tokens(rlx_tokenizer *tok, const char *unk);
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
