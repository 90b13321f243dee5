/* rlx serve: an OpenAI-compatible HTTP server over the batched engine (rlx/engine.h), in
 * apps/rlx/serve/ (the command itself is apps/rlx/cmd_serve.c: options, opening the model or
 * pipeline and the engine, signals, draining):
 *
 * http.c    the HTTP side on libmicrohttpd: routing, the API key, Host and Origin, body limits,
 *           /health, /models, /metrics, and the wait of each request for its engine events
 * openai.c  the generation endpoints: request bodies to engine requests (strict types), the
 *           events of a request to text (stop strings, streaming detokenization), and the
 *           response objects and server-sent event chunks in OpenAI's shapes (and in
 *           llama-server's, for its POST /completion)
 * llama.c   llama-server's POST /completion: its response object and stream events
 * anthropic.c Anthropic's POST /v1/messages: its request as a chat request, its message object,
 *           its stream events, its error shape, and /v1/messages/count_tokens
 * responses.c OpenAI's POST /v1/responses: its request as a chat request, its response object
 *           and its stream events
 * native.c  llama-server's own utility endpoints: /tokenize, /detokenize, /apply-template, /props,
 *           /slots
 * embeddings.c /v1/embeddings (and llama-server's /embeddings) and /v1/rerank, on a session of
 *           their own that runs as a task of the engine's worker
 * request.c request bodies as strict JSON objects and their typed members, for every endpoint
 * shared.c  errors in OpenAI's shape and growable buffers
 * webui.c   the chat page at / and its files, embedded at build time (webui.h)
 *
 * This header is shared; job.h is the generation files' own (openai.c, llama.c, anthropic.c,
 * responses.c). */
#ifndef RLX_APP_SERVE_H
#define RLX_APP_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "rlx/dist.h"
#include "rlx/engine.h"
#include "rlx/grammar.h"
#include "rlx/text.h"

#include <cjson/cJSON.h>
/* monotonic time and the waits on it, shared with librlx: a step of the wall clock moves none of
 * the server's deadlines */
#include "util/clock.h"

/* What the server is doing: /health says 503 until it is ready and again once it drains. */
enum serve_phase { SERVE_LOADING = 0, SERVE_READY = 1, SERVE_DRAINING = 2 };

/* The HTTP status codes the server answers with, counted for /metrics. */
#define SERVE_STATUS_CODES(X) X(200) X(204) X(400) X(401) X(403) X(404) X(405) X(413) X(500) X(501) X(503) X(504)
#define SERVE_COUNT_SLOT(code) +1
enum { SERVE_N_STATUS_CODES = 0 SERVE_STATUS_CODES(SERVE_COUNT_SLOT) };

/* Seconds summed over the finished requests, by stage, for /metrics. */
typedef struct serve_latency {
    uint64_t requests;
    double queue, prompt, decode; /* waiting for a slot; admission to first token; first to last */
} serve_latency;

/* The largest p of embd_normalize's p-norm (a request's or --embd-normalize). */
#define SERVE_MAX_NORM_P 64

/* How embeddings pool the final hidden rows of an input: llama.cpp's pooling_type numbers. */
typedef enum serve_pooling {
    SERVE_POOL_NONE = 0, /* every position's row (only /embeddings answers them) */
    SERVE_POOL_MEAN = 1,
    SERVE_POOL_CLS = 2, /* the first position's */
    SERVE_POOL_LAST = 3,
} serve_pooling;

typedef struct serve_embedder serve_embedder;

typedef struct serve_server {
    /* fixed before the HTTP daemon starts */
    const char *api_key; /* NULL: no key needed */
    size_t api_key_len;
    size_t max_body;                 /* bytes of a request body */
    uint32_t max_tokens_limit;       /* the most max_tokens a request may ask for; 0 = the slot's room */
    uint32_t timeout_s;              /* the longest wait for progress of a request's engine, and idle connections */
    uint32_t request_timeout_s;      /* from a connection's start or its last answer, the time a whole request
                                  * (headers and body) has to arrive */
    uint32_t max_connections;        /* served at once; SERVE_OVERFLOW_CONNECTIONS more hear a 503 */
    uint32_t max_connections_per_ip; /* open connections of one client address; 0 = no limit */
    const char *listen_host;         /* --host: a name besides the loopback ones that Host may say */
    const char *const *cors_origins; /* --cors-origin: origins whose cross-origin requests are served; "*" any */
    size_t n_cors_origins;
    uint32_t completion_default; /* max_tokens of /v1/completions when the request gives none (OpenAI's 16) */
    uint32_t chat_default;       /* the same for chat; 0 = to the end of the slot */
    rlx_sampler_params sampling; /* what a request's absent sampling fields are (OpenAI's, or --temp ...) */
    int has_seed;                /* --seed: the seed of requests that give none (else a fresh one each) */
    int special_in_content;      /* --special-in-content: special tokens in chat messages are parsed */
    int reasoning_split;         /* --reasoning-format auto/deepseek: <think> goes to reasoning_content */
    int think;                   /* --reasoning: enable_thinking of chat requests that do not give it */
    const char *chat_template;   /* --chat-template-file's text, or NULL: the model's template */
    int no_slots;                /* --no-slots: GET /slots answers 501, as llama-server's */
    int embedding, reranking;    /* --embedding, --reranking: their endpoints answer (else 501) */
    int pooling;                 /* serve_pooling of embeddings: --pooling, else the model's config */
    int embd_normalize;          /* --embd-normalize: a request's embd_normalize when it gives none */
    int no_webui;                /* --no-webui: no chat page at / (404) */
    /* set once loaded (phase becomes SERVE_READY after them) */
    const char *model_id;   /* what /v1/models lists and responses echo when a request names none */
    const char *model_path; /* the model's file or directory (/props), NULL over a pipeline's file */
    const char *build_info; /* rlx's version (/props) */
    uint32_t n_slots;       /* requests generated at once */
    rlx_engine *engine;
    const rlx_tokenizer *tok;
    rlx_grammar_vocab *gvocab; /* tok's vocabulary for constrained replies */
    int64_t vocab;
    uint32_t slot_positions;
    const rlx_driver *driver; /* the pipeline's driver, NULL without a pipeline */
    serve_embedder *embedder; /* with --embedding or --reranking */
    atomic_int phase;
    /* for /metrics */
    atomic_uint_fast64_t responses[SERVE_N_STATUS_CODES];
    atomic_uint_fast64_t invalid_requests; /* generation requests refused with a 4xx */
    pthread_mutex_t latency_mu;
    serve_latency latency;
} serve_server;

/* Counts a response of status code for /metrics. */
void serve_count_response(serve_server *s, unsigned code);

// ---- errors ----

/* An error to answer in OpenAI's shape {"error":{"message","type","param","code"}}. */
typedef struct serve_error {
    unsigned status;  /* HTTP status */
    const char *type; /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code; /* NULL for null */
    char param[64];   /* "" for null */
    char message[512];
    unsigned retry_after; /* seconds for a Retry-After header, 0 for none */
} serve_error;

void serve_error_set(serve_error *e, unsigned status, const char *type, const char *code, const char *param,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error's JSON body, malloc'd (NULL when out of memory). */
char *serve_error_json(const serve_error *e);
/* The same in Anthropic's shape {"type":"error","error":{"type","message"}} (anthropic.c). */
char *serve_anthropic_error_json(const serve_error *e);
/* POST /v1/messages/count_tokens: {"input_tokens"} of the request's rendered prompt, or NULL
 * after setting e (anthropic.c). */
char *serve_anthropic_count_tokens(const serve_server *s, const char *body, size_t len, serve_error *e);

// ---- growable byte buffers ----

typedef struct serve_buf {
    char *data;
    size_t len, cap;
    int failed; /* an append ran out of memory; the contents are incomplete */
} serve_buf;

void serve_buf_append(serve_buf *b, const char *data, size_t len);
/* Appends printf's text of at most 511 bytes. */
void serve_buf_printf(serve_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void serve_buf_free(serve_buf *b);

// ---- request bodies ----

/* The body as a JSON object, or NULL after setting e (400): invalid JSON (with the byte where
 * it stops, this request's own), anything after the value, a NUL in it, a key given twice. */
cJSON *serve_parse_body(const char *body, size_t len, serve_error *e);
/* A member that may be absent: NULL when missing or null, as OpenAI reads both. */
const cJSON *serve_member(const cJSON *root, const char *name);
/* Typed members: 1 when given, 0 when absent (out untouched), -1 after setting e to a 400
 * naming the member and what it must be. Numbers within [lo, hi]; integers exact (JSON numbers
 * are doubles, exact up to 2^53). */
int serve_get_number(const cJSON *root, const char *name, double lo, double hi, double *out, serve_error *e);
int serve_get_integer(const cJSON *root, const char *name, double lo, double hi, double *out, serve_error *e);
int serve_get_bool(const cJSON *root, const char *name, int *out, serve_error *e);
int serve_get_string(const cJSON *root, const char *name, const char **out, serve_error *e);
/* A 400 for param: fmt holds two %s, the param's name and what, so "'%s' must be %s"; -1. */
int serve_bad(serve_error *e, const char *param, const char *fmt, const char *what);

// ---- jobs: one generation request ----

/* /v1/chat/completions, /v1/completions, llama-server's own POST /completion (its request
 * fields n_predict and n_probs, its response shape, and streams of its events without [DONE]),
 * Anthropic's /v1/messages (its request, response and stream events; its error shape) and
 * OpenAI's /v1/responses (its request, response object and stream events). */
typedef enum serve_endpoint {
    SERVE_CHAT = 0,
    SERVE_COMPLETION = 1,
    SERVE_LLAMA_COMPLETION = 2,
    SERVE_ANTHROPIC = 3, /* Anthropic's POST /v1/messages */
    SERVE_RESPONSES = 4, /* OpenAI's POST /v1/responses */
} serve_endpoint;

typedef struct serve_job serve_job;

/* Parses and checks a request body for endpoint ep (strict types, unknown fields ignored) and
 * tokenizes its prompt. On failure *out is NULL and err says why (400, naming the field). */
int serve_job_parse(serve_server *s, serve_endpoint ep, const char *body, size_t len, serve_job **out,
                    serve_error *err);
/* A chat request's messages (tools, chat_template_kwargs) rendered by the model's chat template
 * (or --chat-template-file's) into *prompt, with the spans of the template's own markup (the
 * only text whose special tokens count, unless --special-in-content); both malloc'd. -1 after
 * setting e (400 naming the field, or a template the engine cannot render). */
int serve_render_chat(const serve_server *s, const cJSON *root, char **prompt, rlx_text_span **markup, size_t *n_markup,
                      serve_error *e);
/* The prompt ids of a chat request (serve_render_chat, then encoded as /v1/chat/completions
 * runs it, at most a slot's positions less one); malloc'd into *ids, *n. -1 after setting e. */
int serve_chat_prompt(const serve_server *s, const cJSON *root, int32_t **ids, size_t *n, serve_error *e);
/* Whether the client asked for server-sent events. */
int serve_job_streams(const serve_job *j);
/* The sampling parameters the request asked for (its logit biases included), as the engine
 * gets them. */
const rlx_sampler_params *serve_job_sampler(const serve_job *j);
/* Submits the job to the engine. On failure err says why (503 with Retry-After when the queue
 * is full or the server drains, 400 for a prompt longer than a slot, 500 otherwise) and the job
 * is still the caller's to release. */
int serve_job_submit(serve_server *s, serve_job *j, serve_error *err);

typedef enum serve_wait {
    SERVE_WAIT_NEWS = 0,     /* new text, log-probabilities or the end */
    SERVE_WAIT_HANGUP,       /* the connection broke: the client reset it, or refused a write */
    SERVE_WAIT_TIMEOUT,      /* neither the job nor the engine made progress for the server's timeout */
    SERVE_WAIT_PEER_SHUTDOWN /* the client sent all it will (a FIN): a half-close or a close */
} serve_wait;

/* Waits until the job has news beyond what the connection consumed, the connection of socket
 * fd breaks (checked every few milliseconds), or timeout_s seconds pass in which neither the
 * job nor the engine progressed (a queued job waits while the requests ahead of it run). A FIN
 * from the client is no hang-up: it ends the wait with SERVE_WAIT_PEER_SHUTDOWN only when
 * report_shutdown, so that the caller can write something and learn from the reset that a
 * closed client's kernel answers with whether the client is gone; a half-closed client, which
 * still reads, gets its answer. */
serve_wait serve_job_wait(serve_job *j, int fd, uint32_t timeout_s, int report_shutdown);
/* Whether the engine has finished the job and everything it produced is consumed. */
int serve_job_finished(serve_job *j);

/* The whole response of a finished job: its JSON body and status (200, or the error's). */
char *serve_job_response(serve_job *j, unsigned *status);
/* Appends to out the server-sent events for what arrived since the last call (the first call
 * also opens the stream); returns 1 once the stream is complete (the final chunk, the usage
 * chunk when asked for, and "data: [DONE]" appended). */
int serve_job_stream(serve_job *j, serve_buf *out);

/* Gives up the connection's hold on j: a job the engine still runs is cancelled first (its slot
 * is free for the next step), and j is freed once the engine has delivered its DONE. NULL is a
 * no-op. */
void serve_job_release(serve_job *j);

// ---- llama-server's utility endpoints (native.c) ----

typedef enum serve_native { SERVE_TOKENIZE = 0, SERVE_DETOKENIZE, SERVE_APPLY_TEMPLATE } serve_native;

/* The JSON answer (malloc'd) of POST /tokenize, /detokenize or /apply-template to body, or NULL
 * after setting e (400 naming the field, 500 when out of memory). */
char *serve_native_answer(const serve_server *s, serve_native ep, const char *body, size_t len, serve_error *e);
/* GET /props: the slots and their context, the model, its chat template and special tokens;
 * malloc'd, NULL when out of memory. */
char *serve_props_json(const serve_server *s);
/* GET /slots: llama-server's array of the engine's slots as they are now (rlx_engine_slot_info),
 * malloc'd, or NULL after setting e (500). *n_idle says how many take no request. */
char *serve_slots_json(const serve_server *s, uint32_t *n_idle, serve_error *e);
/* llama-server's sampling parameters of a request (n_predict, seed, temperature, ...) into the
 * object p (nothing when p is NULL): /slots' params, /props' defaults, /completion's
 * generation_settings. max_tokens 0 is no limit (-1). */
void serve_params_json(cJSON *p, const rlx_sampler_params *sp, uint32_t max_tokens, uint32_t n_probs, int grammar);

// ---- embeddings and rerank (embeddings.c) ----

/* The session embeddings and rerank run on: the whole model m (borrowed) with options so; with
 * rerank, the ids of the tokens "yes" and "no" must be in tok's vocabulary. */
rlx_status serve_embedder_create(const rlx_model *m, const rlx_session_options *so, const rlx_tokenizer *tok,
                                 int rerank, serve_embedder **out);
void serve_embedder_destroy(serve_embedder *emb); /* NULL is a no-op */
/* "none", "mean", "cls", "last", and back (-1 for another name). */
const char *serve_pooling_name(int pooling);
int serve_pooling_parse(const char *name);
/* The pooling a sentence-transformers folder states (modules.json, then its Pooling module's
 * config.json); -1 when it states none, -2 when it states one rlx lacks or cannot be read (why
 * says which, in both cases). */
int serve_pooling_of_model(const char *dir, char *why, size_t why_len);
/* The JSON answer (malloc'd) of POST /v1/embeddings (oai) or /embeddings to body, or NULL after
 * setting e: 400 naming the field, 501 without --embedding, 503/504 as generation's; e->status
 * 0 when the client of socket fd hung up (nobody to answer). */
char *serve_embeddings_answer(serve_server *s, int oai, const char *body, size_t len, int fd, serve_error *e);
/* The same for POST /v1/rerank (501 without --reranking). */
char *serve_rerank_answer(serve_server *s, const char *body, size_t len, int fd, serve_error *e);

// ---- the HTTP daemon ----

/* Connections over --max-connections that are still answered (with a 503) before the daemon
 * refuses the TCP connection itself. */
#define SERVE_OVERFLOW_CONNECTIONS 256

typedef struct serve_http serve_http;

/* Starts listening on host:port (port 0: any free one) with a thread per connection, at most
 * s->max_connections at once and s->max_connections_per_ip of one address; verbose lets
 * libmicrohttpd log. On failure err holds a message. */
int serve_http_start(serve_server *s, const char *host, uint16_t port, int verbose, serve_http **out, char *err,
                     size_t err_len);
uint16_t serve_http_port(const serve_http *h);
/* Stops accepting connections; those open keep being served. */
void serve_http_quiesce(serve_http *h);
/* Waits up to timeout_ms for the generation requests being answered to finish sending. */
void serve_http_settle(serve_http *h, uint32_t timeout_ms);
/* Closes every connection and stops the daemon. NULL is a no-op. */
void serve_http_stop(serve_http *h);

#endif
