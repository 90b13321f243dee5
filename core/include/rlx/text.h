/* Text: the BPE tokenizer of a Hugging Face `tokenizer.json` (or a GGUF file's tokenizer.ggml.*)
 * and the model's chat template, so that token ids are bit-identical to the Hugging Face
 * `tokenizers` library. docs/tokenizers.md has the whole list; in short:
 *   normalizer     null, NFC, Prepend, Replace (String pattern), Sequence of those;
 *   pre_tokenizer  ByteLevel (GPT-2's regex), Sequence[Split(Regex, Isolated), ByteLevel]
 *                  (Qwen2/3's, Llama 3's regex), Metaspace, or null (one word per piece);
 *   model          BPE with merges as "a b" strings or [a, b] pairs, ignore_merges,
 *                  byte_fallback, unk_token / fuse_unk; no dropout, continuing_subword_prefix
 *                  or end_of_word_suffix;
 *   decoder        ByteLevel, or Replace / ByteFallback / Fuse / Strip / Metaspace in a Sequence;
 *   post_processor TemplateProcessing, ByteLevel (applied only with add_special).
 * Anything else is RLX_E_UNSUPPORTED naming the file and the component, rather than ids that
 * quietly differ from Hugging Face's. Encoding gives what Hugging Face's encode(text,
 * add_special_tokens=False) gives unless rlx_encode_options.add_special asks for the BOS/EOS.
 *
 * Encoding follows tokenizers' TokenizerImpl: added tokens are split off first (leftmost-longest
 * match; tokens with normalized=false on the raw text, then normalized=true ones on the
 * normalized text; lstrip, rstrip and single_word as Hugging Face applies them), the remaining
 * text is NFC-normalised (utf8proc) if the normalizer says so, cut by the pre-tokenizer regex
 * (PCRE2 in UTF + UCP mode, with \s spelled out as Unicode White_Space as Oniguruma has it),
 * mapped to the ByteLevel alphabet and merged by rank. Letters and digits assigned after
 * Unicode 14 (the tables of Debian 12's PCRE2) may pre-tokenize differently from a Hugging Face
 * build with newer tables; NFC uses utf8proc's Unicode 15 tables.
 *
 * A tokenizer is immutable after loading except for an internal word cache guarded by a mutex,
 * so one tokenizer may be used from several threads at once. */
#ifndef RLX_TEXT_H
#define RLX_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/model.h"
#include "rlx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlx_tokenizer rlx_tokenizer;

/* Loads model_dir/tokenizer.json and, when present, model_dir/tokenizer_config.json (chat
 * template, eos/pad/bos token names, added tokens missing from tokenizer.json) or
 * model_dir/chat_template.jinja. A missing or unreadable tokenizer.json is RLX_E_IO, text that
 * is not JSON or lacks a required part is RLX_E_FORMAT, an unsupported component is
 * RLX_E_UNSUPPORTED; each message names the file. On failure *out is NULL and nothing leaks.
 * model_dir may also be a GGUF file: the tokenizer is then its tokenizer.ggml.* metadata (model
 * gpt2 with pre-tokenizer qwen2, llama-bpe (llama3, llama-v3) or gpt2; or model llama, a
 * SentencePiece BPE merged by tokenizer.ggml.scores as llama.cpp does), which gives the ids the
 * checkpoint's tokenizer.json gives:
 * normal tokens form the BPE vocabulary, control tokens are the special added tokens and
 * user-defined ones the other added tokens, unused (padding) ids are gaps; the special ids and
 * the chat template come from the metadata too. */
RLX_API rlx_status rlx_tokenizer_open(const char *model_dir, rlx_tokenizer **out);

/* The tokenizer of an open model, the one rlx_tokenizer_open(rlx_model_dir(model)) loads, but a
 * GGUF model's comes from the header the model parsed at open instead of a second parse of the
 * file (Qwen3's 151k tokens and merges, a few milliseconds and a second walk of its metadata).
 * The tokenizer keeps nothing of the model, which may be closed first. Errors as
 * rlx_tokenizer_open's. */
RLX_API rlx_status rlx_tokenizer_open_model(const rlx_model *model, rlx_tokenizer **out);
RLX_API void rlx_tokenizer_close(rlx_tokenizer *tok); /* NULL is a no-op */

/* One more than the largest token id (vocabulary plus added tokens), as Hugging Face's
 * get_vocab_size(with_added_tokens=True). The model's embedding may have more rows. */
RLX_API int32_t rlx_tokenizer_vocab_size(const rlx_tokenizer *tok);

/* Encodes len bytes of UTF-8 text (which may contain NUL bytes). With parse_special, the added
 * tokens marked special (<|im_start|>, <|endoftext|> ...) are recognised in the text; without
 * it they are encoded as plain text, as Hugging Face's split_special_tokens=True does (added
 * tokens that are not special, like <think>, are still recognised, as there). No BOS/EOS is
 * added. On success *ids is an array of *n_ids ids (NULL when the text is empty) that the
 * caller releases with rlx_free. Text that is not valid UTF-8 is RLX_E_INVALID naming the byte
 * offset of the first invalid sequence. */
RLX_API rlx_status rlx_tokenizer_encode(const rlx_tokenizer *tok, const char *text, size_t len, int parse_special,
                                        int32_t **ids, size_t *n_ids);

/* A byte range [off, off + len) of a text. */
typedef struct rlx_text_span {
    size_t off, len;
} rlx_text_span;

/* Options of rlx_tokenizer_encode_ex. Zero-initialise, set size; members are only ever appended. */
typedef struct rlx_encode_options {
    uint32_t size;     /* sizeof(rlx_encode_options) */
    int parse_special; /* as rlx_tokenizer_encode's, where special_spans is NULL */
    /* Not NULL: special tokens are recognised only where the whole token lies inside one of these
     * n_special_spans spans (sorted by offset, not overlapping, inside the text) and are plain
     * text elsewhere (parse_special is then unused). Added tokens that are not special are
     * recognised everywhere, as always. The text is still encoded as one piece: the pre-tokenizer
     * and the merges see across span boundaries as they do in rlx_tokenizer_encode, so a text
     * with no special-token text outside the spans gets exactly the ids of rlx_tokenizer_encode
     * with parse_special. rlx_chat_render_spans gives the spans of a chat template's own markup,
     * which keeps messages from forging roles with <|im_start|> in their text. */
    const rlx_text_span *special_spans;
    size_t n_special_spans;
    /* Not 0: encoding stops as soon as the text is known to encode to more than max_ids ids, and
     * *truncated says so; the ids are then a prefix of the full encoding with at most max_ids ids
     * (fewer only when a word of over 256 bytes would pass the limit alone). The work then done is that
     * of the prefix, besides the UTF-8 check of the whole text and NFC normalisation (which a
     * normalizer applies to the text between added tokens, whole). */
    size_t max_ids;
    /* Not 0: the ids the model's files put around a text are added, as Hugging Face's
     * encode(text, add_special_tokens=True) does: tokenizer.json's post_processor
     * (TemplateProcessing "single"), or tokenizer_config.json's add_bos_token / add_eos_token
     * where given; for a GGUF file tokenizer.ggml.add_bos_token / add_eos_token, else llama.cpp's
     * default for its tokenizer (BOS for 'llama' and the Llama 3 pre-tokenizers). They count
     * toward max_ids. Raw prompts want them (Llama 3, Mistral: a BOS; Qwen3: nothing); a chat
     * template writes its own bos_token text, so a rendered chat is encoded without them, as
     * Hugging Face's apply_chat_template does. */
    int add_special;
} rlx_encode_options;

/* rlx_tokenizer_encode with options (opts NULL: parse_special 0, no spans, no limit). truncated
 * may be NULL; otherwise *truncated is 1 when max_ids stopped the encoding, else 0. Spans that
 * are unsorted, overlap or reach past len are RLX_E_INVALID. */
RLX_API rlx_status rlx_tokenizer_encode_ex(const rlx_tokenizer *tok, const char *text, size_t len,
                                           const rlx_encode_options *opts, int32_t **ids, size_t *n_ids,
                                           int *truncated);

/* Flags of rlx_tokenizer_decode and rlx_detok_create. */
enum rlx_decode_flags {
    RLX_DECODE_SKIP_SPECIAL = 1, /* drop special tokens, as skip_special_tokens=True */
    RLX_DECODE_STRICT = 2,       /* an id without a token is RLX_E_RANGE instead of being skipped */
};

/* Decodes n ids to UTF-8 as Hugging Face's decode does: the bytes of the tokens, with every
 * maximal invalid UTF-8 subsequence replaced by U+FFFD (String::from_utf8_lossy), added tokens
 * copied as they are, ids that have no token (negative, past the vocabulary, or a gap) skipped
 * unless RLX_DECODE_STRICT. On success *text is a NUL-terminated string of *len bytes that the
 * caller releases with rlx_free. */
RLX_API rlx_status rlx_tokenizer_decode(const rlx_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                                        char **text, size_t *len);

/* The id of a token given by its exact vocabulary string (an added token such as "<|im_end|>",
 * or a byte-level vocabulary entry such as "Ġthe"). An unknown string is RLX_E_NOT_FOUND with a
 * message naming it; on success the id is returned (ids are non-negative). */
RLX_API int32_t rlx_tokenizer_token_id(const rlx_tokenizer *tok, const char *token);

/* The vocabulary string of id (byte-level form, e.g. "Ġthe"), borrowed from tok; NULL when id has
 * no token. */
RLX_API const char *rlx_tokenizer_token_text(const rlx_tokenizer *tok, int32_t id);

/* 1 when id is an added token marked special, 0 otherwise. */
RLX_API int rlx_tokenizer_is_special(const rlx_tokenizer *tok, int32_t id);

/* Ids of tokenizer_config.json's eos_token, pad_token and bos_token; -1 when not set. */
RLX_API int32_t rlx_tokenizer_eos_id(const rlx_tokenizer *tok);
RLX_API int32_t rlx_tokenizer_pad_id(const rlx_tokenizer *tok);
RLX_API int32_t rlx_tokenizer_bos_id(const rlx_tokenizer *tok);

// ---- streaming decoder ----

/* Turns ids arriving one at a time into UTF-8 text without ever splitting a character: the
 * bytes of an incomplete UTF-8 sequence are held back until a later token completes it. Bytes
 * that can no longer become a valid character are emitted as U+FFFD at once (one per maximal
 * invalid subsequence), so nothing is held for longer than a character, and the concatenated
 * output of push and flush equals rlx_tokenizer_decode of the same ids with the same flags.
 * Under a ByteFallback decoder a run of <0xNN> tokens is held until a token that is not a byte
 * ends it (or flush): Hugging Face decodes the run whole, one U+FFFD a byte if it is not UTF-8. */
typedef struct rlx_detok rlx_detok;

/* tok is borrowed for the decoder's lifetime. */
RLX_API rlx_status rlx_detok_create(const rlx_tokenizer *tok, unsigned flags, rlx_detok **out);
RLX_API void rlx_detok_destroy(rlx_detok *d); /* NULL is a no-op */
/* Adds one id. *text points to the text that became complete (often empty, then *len is 0);
 * it is owned by d, NUL-terminated, and valid until the next call on d. An id without a token is
 * skipped, or RLX_E_RANGE under RLX_DECODE_STRICT. */
RLX_API rlx_status rlx_detok_push(rlx_detok *d, int32_t id, const char **text, size_t *len);
/* Emits what is held back (an incomplete sequence becomes U+FFFD) and resets d for new text. */
RLX_API rlx_status rlx_detok_flush(rlx_detok *d, const char **text, size_t *len);

// ---- stop strings ----

/* Cuts streamed text at the first stop string, byte for byte, so that no byte of a stop string
 * is ever printed even when tokens split it: push returns the bytes that are safe to show now
 * and holds back a tail that could still begin a stop string. When a stop string completes,
 * the text before it is emitted and the stop string and everything after it are dropped.
 * Where several stop strings complete in the same push, the one that completes first in the
 * text wins (among those, the one that starts first), so the result does not depend on how the
 * text was cut into pushes. Multi-byte UTF-8 stop strings work as any bytes do; when the text is
 * valid UTF-8, held-back tails start at a character boundary. */
typedef struct rlx_stop_matcher rlx_stop_matcher;

/* n >= 1 NUL-terminated stop strings, copied. An empty string is RLX_E_INVALID (it would match
 * before any text). On failure *out is NULL. */
RLX_API rlx_status rlx_stop_matcher_create(const char *const *stops, size_t n, rlx_stop_matcher **out);
RLX_API void rlx_stop_matcher_destroy(rlx_stop_matcher *m); /* NULL is a no-op */
/* Adds len bytes of text. *emit points to the bytes that can be shown now (*emit_len of them,
 * possibly 0), owned by m and valid until the next call on it. *stopped is 1 once a stop string
 * has completed, in this push or an earlier one; after that, pushes emit nothing. */
RLX_API rlx_status rlx_stop_matcher_push(rlx_stop_matcher *m, const char *text, size_t len, const char **emit,
                                         size_t *emit_len, int *stopped);
/* At the end of the text: the held-back bytes (none once stopped), valid until the next call. */
RLX_API void rlx_stop_matcher_flush(rlx_stop_matcher *m, const char **emit, size_t *emit_len);
/* Forgets the text seen, for a new stream with the same stop strings. */
RLX_API void rlx_stop_matcher_reset(rlx_stop_matcher *m);

// ---- chat template ----

/* Chat templates are rendered by rlx's Jinja engine (docs/CHAT_TEMPLATES.md): the model's own
 * template from tokenizer_config.json ("chat_template", a string or a list of named templates:
 * "default", and "tool_use" when tools are given), chat_template.jinja or GGUF
 * tokenizer.chat_template, with the variables Hugging Face's apply_chat_template passes:
 * messages, tools, add_generation_prompt, bos_token and eos_token, and the
 * chat_template_kwargs (Qwen3's enable_thinking). The output is byte-identical to
 * @huggingface/jinja's on the templates the tests cover; a template feature the engine lacks is
 * an error naming the template line, never a silently different prompt. */
typedef struct rlx_chat_message {
    const char *role;              /* "system", "user", "assistant", "tool" ... as the template knows them */
    const char *content;           /* NULL counts as "" */
    const char *reasoning_content; /* assistant only, optional: NULL = absent */
} rlx_chat_message;

typedef enum rlx_chat_template_kind {
    RLX_CHAT_TEMPLATE_NONE = 0,    /* the model has no chat template */
    RLX_CHAT_TEMPLATE_UNKNOWN = 1, /* a template the engine cannot parse (rendering says why) */
    RLX_CHAT_TEMPLATE_QWEN3 = 2,   /* retired: was the hand-written Qwen3 template; no longer returned */
    RLX_CHAT_TEMPLATE_JINJA = 3,   /* a template the Jinja engine parses */
} rlx_chat_template_kind;

/* Whether the model has a chat template (tokenizer_config.json, chat_template.jinja or GGUF) and
 * whether the engine parses it. */
RLX_API rlx_chat_template_kind rlx_chat_template_of(const rlx_tokenizer *tok);
/* The model's chat template source (its default one, for a list of named templates), borrowed
 * from tok; NULL when the model has none. */
RLX_API const char *rlx_chat_template_text(const rlx_tokenizer *tok);

/* Renders n >= 1 messages through the model's chat template with add_generation_prompt and
 * enable_thinking (passed as chat_template_kwargs {"enable_thinking": true/false}; templates
 * that do not know it ignore it). A model without a template is RLX_E_NOT_FOUND; a template the
 * engine cannot parse is RLX_E_FORMAT, one that fails while rendering RLX_E_FORMAT (or
 * RLX_E_INVALID for the template's raise_exception, RLX_E_RANGE past a limit), each naming the
 * template line. On success *out is a NUL-terminated string the caller releases with rlx_free. */
RLX_API rlx_status rlx_chat_render(const rlx_tokenizer *tok, const rlx_chat_message *msgs, size_t n,
                                   int add_generation_prompt, int enable_thinking, char **out);

/* rlx_chat_render, and the spans of the rendering that are the template's own text (its markup:
 * <|im_start|>, role names written by the template, newlines, <think> wrappers, bos_token ...);
 * every byte that comes from a message (contents, reasoning, roles, tool calls) or from tools
 * and kwargs is outside them. *markup is an array of *n_markup spans, sorted and not adjacent,
 * that the caller releases with rlx_free; it suits rlx_encode_options.special_spans, so that
 * special-token text inside messages stays text. On failure *out and *markup are NULL. */
RLX_API rlx_status rlx_chat_render_spans(const rlx_tokenizer *tok, const rlx_chat_message *msgs, size_t n,
                                         int add_generation_prompt, int enable_thinking, char **out,
                                         rlx_text_span **markup, size_t *n_markup);

/* Options of rlx_chat_render_ex. Zero-initialise, set size; members are only ever appended. */
typedef struct rlx_chat_options {
    uint32_t size;             /* sizeof(rlx_chat_options) */
    int add_generation_prompt; /* end with the template's generation prompt */
    /* Not NULL: the messages as a JSON array in the OpenAI / Hugging Face form (role, content,
     * reasoning_content, tool_calls with "function": {"name", "arguments"} where arguments is an
     * object, tool_call_id, name ...), given to the template as they are; msgs must then be
     * NULL and n 0. The array may be empty. */
    const char *messages_json;
    const char *tools_json;  /* NULL, or a JSON array of tool definitions: the template's tools */
    const char *kwargs_json; /* NULL, or a JSON object: chat_template_kwargs, each a variable */
    /* NULL: the model's template ("tool_use" of a list of named templates when tools are given
     * and it has one, else "default"); else this template's text, and tok may be NULL (the
     * template then has no bos_token and eos_token). */
    const char *chat_template;
} rlx_chat_options;

/* Renders msgs (or opts->messages_json) with the options, as rlx_chat_render_spans does (markup
 * and n_markup may be NULL). opts NULL: no generation prompt, the model's template. JSON that
 * does not parse or has the wrong shape is RLX_E_INVALID naming the option. */
RLX_API rlx_status rlx_chat_render_ex(const rlx_tokenizer *tok, const rlx_chat_message *msgs, size_t n,
                                      const rlx_chat_options *opts, char **out, rlx_text_span **markup,
                                      size_t *n_markup);

#ifdef __cplusplus
}
#endif
#endif
