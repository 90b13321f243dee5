/* What generate prints of the tokens it generates: streamed text (cut at --stop strings), token
 * ids, or with --json one JSON object at the end, with --logprobs each token's log-probability
 * and its most likely alternatives. */
#ifndef RLX_APP_OUTPUT_H
#define RLX_APP_OUTPUT_H

#include <stdint.h>
#include <stdio.h>

#include "rlx/rlx.h"

#define APP_MAX_LOGPROBS 20 /* OpenAI's bound on top_logprobs */

typedef struct app_output_options {
    const rlx_tokenizer *tok; /* NULL: print the ids, space-separated */
    const char *const *stops; /* stop strings (text only) */
    size_t n_stops;
    int json;              /* one JSON object at the end instead of streaming */
    int logprobs;          /* with json: each token's log-probability ... */
    uint32_t top_logprobs; /* ... and this many alternatives (at most APP_MAX_LOGPROBS) */
    int64_t vocab;
    FILE *out;
} app_output_options;

/* How generation ended, for the JSON object (finish_reason is OpenAI's: "stop" or "length"). */
typedef struct app_finish {
    const char *stopped_by; /* "eos", "stop_string", "max_tokens", "context" */
    const rlx_gen_stats *stats;
    uint64_t seed;
    int greedy;
} app_finish;

typedef struct app_output app_output;

/* 1 after reporting (a stop matcher or detokenizer could not be made). */
int app_output_create(const app_output_options *opts, app_output **out);
void app_output_destroy(app_output *o);
/* One generated token with the raw logits row it was drawn from (may be NULL without
 * logprobs): 0 to go on, 1 to stop (a stop string completed, or the output failed). */
int app_output_token(app_output *o, int32_t token, const float *logits);
/* Whether a stop string ended the text. */
int app_output_stopped(const app_output *o);
/* Prints what is held back and the end (a newline, or the JSON object). 1 after reporting a
 * failure to write. */
int app_output_finish(app_output *o, const app_finish *f);

/* Adds a token's members to a JSON object: "token" (its text, invalid UTF-8 replaced by U+FFFD,
 * since a byte-level token can hold part of a character) and "bytes" (exact), as OpenAI's
 * logprobs give them (rlx serve uses it too). */
struct cJSON;
void app_json_add_token_text(struct cJSON *obj, const rlx_tokenizer *tok, int32_t id);

#endif
