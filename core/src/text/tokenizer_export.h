/* What a GGUF writer needs of a loaded tokenizer, without the tokenizer's layout (internal). */
#ifndef RLX_TOKENIZER_EXPORT_H
#define RLX_TOKENIZER_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/text.h"

/* Token id's vocabulary string (byte-level spelling, as tokenizer.json and GGUF store it) and its
 * llama.cpp token type: 1 normal, 3 control (a special added token, or an added one spelled
 * "<|...|>", as llama.cpp's converter decides), 4 user-defined (another added token); NULL for an
 * id with no token. */
const char *rlx__tokenizer_token(const rlx_tokenizer *tok, int32_t id, size_t *len, int *type);

/* The merges in rank order as (left id, right id) pairs: *pairs is malloc'd (2 * *n ids), the
 * caller frees it. RLX_E_NOMEM when out of memory. */
rlx_status rlx__tokenizer_merges(const rlx_tokenizer *tok, int32_t **pairs, size_t *n);

/* The chat template text, or NULL. */
const char *rlx__tokenizer_chat_template(const rlx_tokenizer *tok);

#endif
