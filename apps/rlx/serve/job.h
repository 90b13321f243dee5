/* The generation jobs of rlx serve as the files that shape their answers see them: openai.c
 * runs them (parsing, the engine's events, the waits) and answers in OpenAI's shapes, llama.c in
 * llama-server's, anthropic.c in Anthropic's and responses.c in the Responses API's. Private to
 * those four files. */
#ifndef RLX_APP_SERVE_JOB_H
#define RLX_APP_SERVE_JOB_H

#include <pthread.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common.h"
#include "rlx/grammar.h"
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

/* How the chat template writes a tool call (tools.c). */
typedef enum serve_call_format {
    SERVE_CALLS_NONE = 0,
    SERVE_CALLS_HERMES = 1, /* <tool_call>{"name": ..., "arguments": {...}}</tool_call> */
    SERVE_CALLS_XML = 2,    /* <tool_call><function=NAME><parameter=KEY>...</parameter></function></tool_call> */
} serve_call_format;

typedef enum serve_tool_choice {
    SERVE_TOOLS_NONE = 0,
    SERVE_TOOLS_AUTO = 1,
    SERVE_TOOLS_REQUIRED = 2,
    SERVE_TOOLS_NAMED = 3,
} serve_tool_choice;

/* Where the scan of a reply for tool calls is (serve_calls_scan). */
typedef struct serve_calls {
    int phase;    /* 0: whether the reply opens with <think> is not known yet; 1: in it; 2: after */
    int reasoned; /* some of the <think> block went out */
    size_t at;    /* bytes of the text consumed */
    int in_call;  /* inside a call block whose text starts at call_start */
    size_t call_start;
    int after_call; /* the last thing consumed was a call: whitespace next is the format's */
    int announced;  /* the call's id and name went out; its arguments follow from args_sent */
    size_t args_sent;
    int index;             /* calls found so far */
    int block, block_kind; /* Anthropic's stream: the content block open (index; 0 none, 1 text, 2 tool_use) */
    char id[40];
} serve_calls;

/* What the scan finds, in order: reasoning (a thinking model's <think> block), content text,
 * and calls. A call opens with its id and name (and maybe all its arguments); calls with a NULL
 * id add arguments to the open one, and with NULL arguments too drop it (the reply ended inside
 * it, so it is no call). */
typedef struct serve_call_sink {
    void (*reasoning)(void *ctx, const char *text, size_t len);
    void (*content)(void *ctx, const char *text, size_t len);
    void (*call)(void *ctx, int index, const char *id, const char *name, const char *args, size_t len);
    void *ctx;
} serve_call_sink;

/* A request's n choices (OpenAI's n, llama-server's n_cmpl) run as n engine requests that share
 * one prompt pass (rlx_engine_submit_choices). Choice 0 is the job http.c holds: it owns the
 * request (prompt, options, grammar, tools, stop strings) and the lock, condition and references
 * every choice uses. Choices 1 .. n - 1 hold the request's fields, pointing at what choice 0
 * owns, own only their reply (detokenizer, stop matcher, text, log-probabilities, scan), and
 * sample with seed + index. */
struct serve_job {
    serve_job *group;    /* choice 0: whose mu, cv and refs this choice uses (itself for choice 0) */
    serve_job **choices; /* choice 0's: [n_choices], choices[0] is itself */
    uint32_t n_choices;  /* choice 0's; 1 without n */
    uint32_t index;      /* this choice's, 0 .. n_choices - 1 */
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

    /* tools.c: the reply's constraint and its tool calls */
    rlx_grammar *grammar; /* NULL without one */
    cJSON *tools;         /* the request's tools when calls are parsed out of the reply */
    int call_format;      /* serve_call_format; SERVE_CALLS_NONE: the reply is content */
    serve_tool_choice tool_choice;
    int reasoning;  /* the <think> block goes to reasoning_content */
    int think_open; /* the prompt left the model inside its <think> block */

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
    serve_calls calls;   /* the stream's scan for tool calls */
    uint64_t steps_seen; /* the engine's step count when the job last looked (for --timeout) */
    int opened;
    int closed;    /* the stream's last event of this choice went out (its finish, or an error) */
    cJSON *output; /* responses.c's stream: the output items so far, the last one open while
                    * calls.block_kind says so */
    uint64_t seq;  /* responses.c's stream: the next event's sequence_number */
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

/* openai.c: the text of string member name of o (none: "") with len bytes of more after it, as
 * the member's new value; 0, or -1 when memory ran out (o unchanged). */
int serve_json_append(cJSON *o, const char *name, const char *more, size_t len);
/* openai.c: member name of from (when present, not null) copied into to as member as; 0, or -1
 * after setting e (out of memory). */
int serve_json_copy(cJSON *to, const cJSON *from, const char *name, const char *as, serve_error *e);
/* openai.c: a random id of prefix and 24 hex digits. */
void serve_make_id(char *out, size_t size, const char *prefix);

/* tools.c: the tool-call format of a chat template. */
serve_call_format serve_call_format_of(const char *tmpl);
/* tools.c: the request's tools, tool_choice, parallel_tool_calls, response_format, json_schema
 * and grammar into j (grammar, tools, call_format, tool_choice); prompt is the rendered chat (or
 * NULL), which says whether the model starts inside its thinking. -1 after setting e. */
int serve_constraint_parse(serve_job *j, const cJSON *root, const char *prompt, serve_error *e);
/* tools.c: whether a chat reply is scanned (for reasoning or tool calls) rather than all content. */
int serve_reply_scanned(const serve_job *j);
/* tools.c: scans j->text from j->calls on, telling sink the reasoning, content and tool calls found; text
 * that may still become a call is held back unless final (the reply is complete). Under j->mu. */
void serve_calls_scan(serve_job *j, int final, const serve_call_sink *sink);

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

/* responses.c: a /v1/responses body as a chat request (messages from instructions and input,
 * max_tokens, tools, tool_choice, response_format), or NULL after setting e naming the
 * Responses API's field; the response object and the stream of its events as anthropic.c's. */
cJSON *serve_responses_request(const cJSON *root, serve_error *e);
cJSON *serve_responses_response(serve_job *j);
int serve_responses_stream(serve_job *j, serve_buf *out);

#endif
