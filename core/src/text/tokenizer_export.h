/* What a GGUF writer needs of a loaded tokenizer, without the tokenizer's layout (internal). */
#ifndef RLX_TOKENIZER_EXPORT_H
#define RLX_TOKENIZER_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/text.h"

/* Token id's vocabulary string (byte-level spelling, as tokenizer.json and GGUF store it) and its
 * llama.cpp token type: 1 normal, 2 unknown (a SentencePiece vocabulary's unk token), 3 control
 * (a special added token, or an added one spelled "<|...|>", as llama.cpp's converter decides),
 * 4 user-defined (another added token), 6 byte (a SentencePiece <0xNN> token); NULL for an id
 * with no token. */
const char *rlx__tokenizer_token(const rlx_tokenizer *tok, int32_t id, size_t *len, int *type);

/* The merges in rank order as (left id, right id) pairs: *pairs is malloc'd (2 * *n ids), the
 * caller frees it. RLX_E_NOMEM when out of memory. */
rlx_status rlx__tokenizer_merges(const rlx_tokenizer *tok, int32_t **pairs, size_t *n);

/* How a GGUF file names the tokenizer, as llama.cpp's converter writes it. */
typedef struct rlx__tokenizer_gguf_kind {
    const char *model;    /* tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece) */
    const char *pre;      /* gpt2: tokenizer.ggml.pre, the split regex's name; NULL for llama */
    int add_space_prefix; /* llama: a U+2581 is prepended to each piece of text */
    int add_bos, add_eos; /* what add_special puts around a text */
} rlx__tokenizer_gguf_kind;

/* The kind of tok, or RLX_E_UNSUPPORTED when GGUF's tokenizers cannot express it (a split regex
 * llama.cpp has no name for, a Metaspace pre-tokenizer ...), naming what is missing. */
rlx_status rlx__tokenizer_gguf(const rlx_tokenizer *tok, rlx__tokenizer_gguf_kind *out);

/* tokenizer.ggml.scores of a "llama" vocabulary for ids [0, n): a token that merges make scores
 * minus the rank of the first merge making it (llama.cpp merges by highest score, so the ranks
 * keep their order), every other one 0. *scores is malloc'd; RLX_E_NOMEM when out of memory. */
rlx_status rlx__tokenizer_scores(const rlx_tokenizer *tok, int64_t n, float **scores);

/* The chat template text, or NULL. */
const char *rlx__tokenizer_chat_template(const rlx_tokenizer *tok);

#endif
