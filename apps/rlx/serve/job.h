/* The generation jobs of rlx serve as the files that shape their answers see them: openai.c
 * runs them (parsing, the engine's events, the waits) and answers in OpenAI's shapes, llama.c in
 * llama-server's and anthropic.c in Anthropic's. Private to those three files. */
#ifndef RLX_APP_SERVE_JOB_H
#define RLX_APP_SERVE_JOB_H

#include <pthread.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common.h"
#include "serve.h"

/* OpenAI's bound on top_logprobs; completions' integer logprobs take the same. */
#define MAX_TOP RLX_ENGINE_MAX_TOP_LOGPROBS

typedef struct token_lp {
    int32_t token;
    float logprob;
    uint32_t n_top;
    int32_t top_ids[MAX_TOP];
    float top_logprobs[MAX_TOP];
    size_t text_offset; /* bytes of decoded text before this token's */
} token_lp;

struct serve_job {
    serve_server *server;
    serve_endpoint ep;
    int stream, include_usage, logprobs;
    int ignore_eos; /* llama.cpp's extension: no end-of-sequence id ends the request */
    uint32_t top_logprobs;
    char id[48];
    long long created;
    char *model;
    int32_t *prompt;
    size_t n_prompt;
    uint32_t max_tokens;
    rlx_sampler_params sampler;
    rlx_logit_bias *biases; /* sampler.logit_bias, malloc'd */
    char *stops[APP_MAX_STOPS];
    size_t n_stops;

    /* the engine worker's alone */
    rlx_detok *detok;
    rlx_stop_matcher *stopper; /* NULL without stop strings */
    size_t decoded;            /* bytes the detokenizer produced */

    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    uint64_t engine_id; /* 0 until submitted */
    int stop_hit;       /* a stop string completed */
    serve_buf text;     /* the reply's text so far, stop strings cut */
    serve_buf raw;      /* with stop strings: the decoded text before they cut it, to tell which one did */
    token_lp *lps;
    size_t n_lps, cap_lps;
    int done;
    uint32_t finish;
    rlx_status status;
    char message[256];
    rlx_request_usage usage;
    int out_of_memory;
    struct timespec last_news;

    /* the connection's alone */
    size_t text_sent, lps_sent;
    uint64_t steps_seen; /* the engine's step count when the job last looked (for --timeout) */
    int opened;
};

/* The error a finished job ends with (the engine's, a cancellation, memory), or 0 when it
 * ended well; under j->mu. */
int serve_job_end_error(const serve_job *j, serve_error *e);
/* The stop string that ended j, or NULL when none did; under j->mu. */
const char *serve_job_stop_string(const serve_job *j);
/* Appends the server-sent event of root ("event: EVENT" first unless NULL), which is consumed. */
void serve_add_event(serve_buf *out, const char *event, cJSON *root);
/* The same for an error body already printed (freed here; NULL when memory ran out: "{}"). */
void serve_add_error_event(serve_buf *out, const char *event, char *json);

/* llama.c: the final /completion object, and the stream's events since the last call (1 once
 * complete); under j->mu. */
cJSON *serve_llama_response(serve_job *j);
int serve_llama_stream(serve_job *j, serve_buf *out);

/* anthropic.c: a /v1/messages body in the shape openai.c parses (a chat request: messages with
 * the system prompt first, max_tokens, the sampling fields, stop_sequences kept by that name), or NULL
 * after setting e with Anthropic's field names; the answer and the stream as llama.c's. */
cJSON *serve_anthropic_request(const cJSON *root, serve_error *e);
cJSON *serve_anthropic_response(serve_job *j);
int serve_anthropic_stream(serve_job *j, serve_buf *out);

#endif
