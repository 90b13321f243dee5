/* Embeddings and reranking (serve.h), llama-server's and OpenAI's shapes:
 *
 *   POST /v1/embeddings   {"input", "encoding_format" (float, base64), "dimensions", "embd_normalize"}
 *                         -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
 *                         "model", "usage"}; a body with "content" instead of "input" gets the
 *                         native shape, as llama-server answers it
 *   POST /embeddings, /embedding  the same request -> [{"index", "embedding": [[...], ...]}]: one
 *                         pooled vector, or every position's with --pooling none
 *   POST /v1/rerank, /rerank, /reranking, /v1/reranking  {"query", "documents" (Jina) or "texts"
 *                         (TEI), "top_n", "instruction", "return_text"} -> {"results": [{"index",
 *                         "relevance_score"}], ...} best first, or TEI's [{"index", "score"}]
 *
 * An input is run through a session of the server's own on the engine's model: its final-normed
 * hidden rows (rlx_session_hidden) are pooled (the last position's, the mean, the first's, or all
 * of them) and normalized (L2 unless embd_normalize says otherwise). A reranked document is
 * Qwen3-Reranker's prompt (its model card's system text, <Instruct>/<Query>/<Document>, an empty
 * think block), and its score is softmax([logit(no), logit(yes)])[1] at the last position.
 * A reranker GGUF as llama.cpp's converter writes it (Qwen3-Reranker: pooling_type rank) holds
 * those two rows of the LM head as cls.output.weight ([yes, no]) and no LM head of its own when
 * the checkpoint's is untied, and its prompt as tokenizer.chat_template.rerank ({query} and
 * {document} in it): llama-server's scores, softmax(cls.output x the last final-normed hidden
 * row)[0], come from those, and so do rlx's.
 *
 * The session runs on the engine's worker thread as an engine task (rlx_engine_task_submit),
 * because the backends take calls from one thread at a time; the engine's batched slots cannot
 * return hidden rows. Each turn of the task runs one chunk of EMBED_CHUNK positions, and the
 * running chat requests get a step between two turns, so a long input slows their pace as a
 * long prompt of theirs would, and never stops it. Bounds: at most MAX_INPUTS inputs or
 * documents, each at most the session's positions (a slot's), and with --pooling none at most
 * that many positions in all (the answer holds a vector per position). */
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common.h"
#include "rlx/private.h"
#include "serve.h"

/* positions per turn of the task: the engine's default step (rlx_engine_options.step_tokens) */
#define EMBED_CHUNK 128
/* inputs of one request, as OpenAI bounds them */
#define MAX_INPUTS 2048
/* how often a waiting connection looks at its socket */
#define EMBED_POLL_MS 20

#define RERANK_SYSTEM                                                                                                  \
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "       \
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
#define RERANK_END "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
#define RERANK_INSTRUCTION "Given a web search query, retrieve relevant passages that answer the query"

struct serve_embedder {
    rlx_session *session; /* used on the engine's worker alone */
    /* The job whose current input is part-way through the session (worker's alone): an input of
     * several chunks holds the session from its first chunk to its last, and another job's turn
     * waits meanwhile, since the engine interleaves tasks' turns and a truncate would cut it. */
    const struct embed_job *owner;
    int64_t hidden;
    uint32_t capacity;
    int32_t yes_id, no_id; /* -1 without --reranking */
    float *cls;            /* a GGUF reranker's cls.output.weight, [2][hidden] F32; NULL: yes/no logits */
    char *rerank_template; /* its tokenizer.chat_template.rerank, NUL-terminated; NULL: Qwen3-Reranker's prompt */
};

/* The F32 values of n elements of a weight of dtype F32, F16 or BF16; 0, or -1 for another dtype. */
static int weight_f32(const rlx_weight *w, size_t n, float *out) {
    const uint16_t *half = w->data;
    for (size_t i = 0; i < n && w->dtype != RLX_DTYPE_F32; i++) {
        uint32_t bits = (uint32_t)half[i] << 16; /* BF16: F32's upper half */
        if (w->dtype == RLX_DTYPE_F16) {
            const uint32_t sign = (uint32_t)(half[i] & 0x8000) << 16, exp = half[i] >> 10 & 31, man = half[i] & 1023;
            float v = exp == 0    ? ldexpf((float)man, -24)
                      : exp == 31 ? (man ? NAN : INFINITY)
                                  : ldexpf((float)(man | 1024), (int)exp - 25);
            memcpy(&bits, &v, sizeof bits);
            bits |= sign;
        } else if (w->dtype != RLX_DTYPE_BF16) {
            return -1;
        }
        memcpy(&out[i], &bits, sizeof bits);
    }
    if (w->dtype == RLX_DTYPE_F32)
        memcpy(out, w->data, n * sizeof *out);
    return 0;
}

/* A reranker GGUF's head and prompt template into emb, when m is one (it has cls.output.weight). */
static rlx_status read_rerank_gguf(const rlx_model *m, serve_embedder *emb) {
    const rlx_weight *w = rlx_weights_find(rlx_model_weights(m), "cls.output.weight");
    if (!w)
        return RLX_OK;
    const int64_t h = rlx_model_config_of(m)->hidden_size;
    if (w->n_dims != 2 || w->shape[0] != 2 || w->shape[1] != h)
        return rlx_error(RLX_E_FORMAT, "cls.output.weight is not [2, %lld]: a Qwen3-Reranker GGUF's yes and no rows",
                         (long long)h);
    if (!(emb->cls = malloc((size_t)(2 * h) * sizeof *emb->cls)))
        return rlx_error(RLX_E_NOMEM, "out of memory");
    if (weight_f32(w, (size_t)(2 * h), emb->cls) < 0)
        return rlx_error(RLX_E_UNSUPPORTED, "cls.output.weight is %s; --reranking reads it in F32, F16 or BF16",
                         rlx_dtype_name((int)w->dtype));
    const char *text;
    size_t len;
    rlx_status rc = rlx_model_gguf_string(m, "tokenizer.chat_template.rerank", &text, &len);
    if (rc == RLX_E_NOT_FOUND)
        return RLX_OK;
    if (rc != RLX_OK)
        return rc;
    if (!(emb->rerank_template = malloc(len + 1)))
        return rlx_error(RLX_E_NOMEM, "out of memory");
    memcpy(emb->rerank_template, text, len);
    emb->rerank_template[len] = 0;
    return RLX_OK;
}

rlx_status serve_embedder_create(const rlx_model *m, const rlx_session_options *so, const rlx_tokenizer *tok,
                                 int rerank, serve_embedder **out) {
    *out = NULL;
    const rlx_model_config *c = rlx_model_config_of(m);
    serve_embedder *emb = calloc(1, sizeof *emb);
    if (!emb)
        return rlx_error(RLX_E_NOMEM, "out of memory");
    emb->yes_id = emb->no_id = -1;
    rlx_status rc = rerank ? read_rerank_gguf(m, emb) : RLX_OK;
    if (rc != RLX_OK) {
        serve_embedder_destroy(emb);
        return rc;
    }
    if (rerank && !emb->cls &&
        ((emb->yes_id = rlx_tokenizer_token_id(tok, "yes")) < 0 ||
         (emb->no_id = rlx_tokenizer_token_id(tok, "no")) < 0 || emb->yes_id >= c->vocab_size ||
         emb->no_id >= c->vocab_size)) {
        serve_embedder_destroy(emb);
        return rlx_error(RLX_E_UNSUPPORTED, "--reranking scores Qwen3-Reranker's way, by the logits of the tokens "
                                            "'yes' and 'no', which this model's vocabulary lacks");
    }
    const rlx_block_spec spec = {.size = sizeof spec,
                                 .layer_end = (uint32_t)c->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1,
                                 .emit_hidden = 1};
    if ((rc = rlx_session_create(m, &spec, so, &emb->session)) != RLX_OK) {
        serve_embedder_destroy(emb);
        return rc;
    }
    emb->hidden = c->hidden_size;
    emb->capacity = rlx_session_capacity(emb->session);
    *out = emb;
    return RLX_OK;
}

void serve_embedder_destroy(serve_embedder *emb) {
    if (!emb)
        return;
    rlx_session_destroy(emb->session);
    free(emb->cls);
    free(emb->rerank_template);
    free(emb);
}

const char *serve_pooling_name(int pooling) {
    static const char *const names[] = {"none", "mean", "cls", "last"};
    return pooling >= 0 && pooling <= SERVE_POOL_LAST ? names[pooling] : "?";
}

int serve_pooling_parse(const char *name) {
    for (int p = 0; p <= SERVE_POOL_LAST; p++)
        if (strcmp(name, serve_pooling_name(p)) == 0)
            return p;
    return -1;
}

/* A JSON file of dir as cJSON, or NULL when it is absent; *bad when it is there but unreadable. */
static cJSON *read_json(const char *dir, const char *name, int *bad) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (access(path, F_OK) != 0)
        return NULL;
    size_t len;
    char *text = app_read_file("serve: pooling", path, 1 << 20, &len);
    cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    *bad = !root;
    return root;
}

int serve_pooling_of_model(const char *dir, char *why, size_t why_len) {
    int bad = 0;
    snprintf(why, why_len, "the model's folder has no sentence-transformers modules.json");
    cJSON *modules = dir ? read_json(dir, "modules.json", &bad) : NULL;
    const char *path = NULL;
    for (const cJSON *m = cJSON_IsArray(modules) ? modules->child : NULL; m; m = m->next) {
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type"));
        if (type && strstr(type, "models.Pooling"))
            path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "path"));
    }
    char name[512];
    snprintf(name, sizeof name, "%s/config.json", path ? path : "");
    cJSON *config = path ? read_json(dir, name, &bad) : NULL;
    cJSON_Delete(modules);
    if (bad) {
        snprintf(why, why_len, "%s: modules.json or %s is not JSON", dir, name);
        cJSON_Delete(config);
        return -2;
    }
    if (!config)
        return -1;
    static const struct {
        const char *key;
        int pooling;
    } modes[] = {{"pooling_mode_lasttoken", SERVE_POOL_LAST}, {"pooling_mode_mean_tokens", SERVE_POOL_MEAN},
                 {"pooling_mode_cls_token", SERVE_POOL_CLS},  {"pooling_mode_max_tokens", -2},
                 {"pooling_mode_mean_sqrt_len_tokens", -2},   {"pooling_mode_weightedmean_tokens", -2}};
    int pooling = -1;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0] && pooling == -1; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(config, modes[i].key))) {
            pooling = modes[i].pooling;
            snprintf(why, why_len, "%s/%s sets %s, which rlx does not pool by (give --pooling)", dir, name,
                     modes[i].key);
        }
    if (pooling == -1)
        snprintf(why, why_len, "%s/%s sets no pooling mode", dir, name);
    cJSON_Delete(config);
    return pooling;
}

// ---- one request: its inputs, run as an engine task ----

typedef struct embed_job {
    serve_embedder *emb;
    int32_t **inputs;
    uint32_t *lens;
    uint32_t n_inputs;
    int pooling; /* serve_pooling; with rank, only the last position's logits matter */
    int rank;
    /* the worker's */
    uint32_t at_input, at_pos;
    double *acc; /* [hidden]: the current input's pooled sum */
    /* results, complete once done */
    float *vectors; /* pooled: [n_inputs][hidden]; none: every position's rows, input after input */
    double *scores; /* rank: [n_inputs] */
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the connection's and the task's */
    int done, abandoned;
    uint64_t chunks; /* progress, for --timeout */
    rlx_status status;
    char message[256];
} embed_job;

static void job_free(embed_job *j) {
    for (uint32_t i = 0; i < j->n_inputs; i++)
        free(j->inputs[i]);
    free(j->inputs);
    free(j->lens);
    free(j->acc);
    free(j->vectors);
    free(j->scores);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Drops a reference, under mu (released here). */
static void unref_locked(embed_job *j) {
    const int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last)
        job_free(j);
}

/* The first row of the input's answer: pooled vectors one per input, --pooling none's a row per
 * position of every input before it. */
static float *out_row(const embed_job *j, uint32_t input, uint32_t pos) {
    size_t row = input;
    if (j->pooling == SERVE_POOL_NONE) {
        row = pos;
        for (uint32_t i = 0; i < input; i++)
            row += j->lens[i];
    }
    return j->vectors + row * (size_t)j->emb->hidden;
}

/* One chunk of the current input through the session; the input's result once it ends. */
static rlx_status run_chunk(embed_job *j) {
    serve_embedder *emb = j->emb;
    const uint32_t len = j->lens[j->at_input], n = len - j->at_pos < EMBED_CHUNK ? len - j->at_pos : EMBED_CHUNK;
    const int64_t h = emb->hidden;
    if (emb->owner && emb->owner != j)
        return RLX_OK; /* this turn waits for the owner's input to end */
    emb->owner = j;
    rlx_status rc = j->at_pos == 0 ? rlx_session_truncate(emb->session, 0) : RLX_OK;
    const float *logits;
    if (rc == RLX_OK)
        rc = rlx_session_forward(emb->session, j->inputs[j->at_input] + j->at_pos, n, 0, &logits);
    if (rc != RLX_OK)
        return rc;
    const float *rows = rlx_session_hidden(emb->session);
    if (j->at_pos == 0)
        memset(j->acc, 0, (size_t)h * sizeof *j->acc);
    if (j->pooling == SERVE_POOL_NONE && !j->rank)
        memcpy(out_row(j, j->at_input, j->at_pos), rows, (size_t)n * (size_t)h * sizeof *rows);
    for (uint32_t r = 0; j->pooling == SERVE_POOL_MEAN && r < n; r++)
        for (int64_t k = 0; k < h; k++)
            j->acc[k] += rows[(size_t)r * (size_t)h + (size_t)k];
    if (j->pooling == SERVE_POOL_CLS && j->at_pos == 0)
        for (int64_t k = 0; k < h; k++)
            j->acc[k] = rows[k];
    j->at_pos += n;
    if (j->at_pos < len)
        return RLX_OK;
    emb->owner = NULL;
    if (j->rank && emb->cls) { /* softmax of the head's [yes, no] at the last row, [0] */
        const float *last = rows + (size_t)(n - 1) * (size_t)h;
        double yes = 0.0, no = 0.0;
        for (int64_t k = 0; k < h; k++) {
            yes += (double)emb->cls[k] * last[k];
            no += (double)emb->cls[h + k] * last[k];
        }
        j->scores[j->at_input] = 1.0 / (1.0 + exp(no - yes));
    } else if (j->rank) { /* p(yes) of the two: 1 / (1 + e^(no - yes)) */
        j->scores[j->at_input] = 1.0 / (1.0 + exp((double)logits[emb->no_id] - (double)logits[emb->yes_id]));
    } else if (j->pooling == SERVE_POOL_LAST) {
        memcpy(out_row(j, j->at_input, 0), rows + (size_t)(n - 1) * (size_t)h, (size_t)h * sizeof *rows);
    } else if (j->pooling != SERVE_POOL_NONE) {
        float *out = out_row(j, j->at_input, 0);
        const double scale = j->pooling == SERVE_POOL_MEAN ? 1.0 / len : 1.0;
        for (int64_t k = 0; k < h; k++)
            out[k] = (float)(j->acc[k] * scale);
    }
    j->at_input++;
    j->at_pos = 0;
    return RLX_OK;
}

/* The engine task: a chunk a turn until every input ran, the connection left, or the engine
 * cancels it. */
static int job_turn(void *ctx, int cancelled) {
    embed_job *j = ctx;
    pthread_mutex_lock(&j->mu);
    const int abandoned = j->abandoned;
    pthread_mutex_unlock(&j->mu);
    rlx_status rc = RLX_OK;
    if (!cancelled && !abandoned)
        rc = run_chunk(j);
    pthread_mutex_lock(&j->mu);
    j->chunks++;
    const int more = !cancelled && !abandoned && rc == RLX_OK && j->at_input < j->n_inputs;
    if (!more) {
        if (j->emb->owner == j) /* cancelled or failed part-way */
            j->emb->owner = NULL;
        j->done = 1;
        j->status = cancelled ? RLX_E_BUSY : rc;
        snprintf(j->message, sizeof j->message, "%s",
                 cancelled      ? "the server is shutting down"
                 : rc != RLX_OK ? rlx_last_error()
                                : "");
    }
    pthread_cond_broadcast(&j->cv);
    if (more) {
        pthread_mutex_unlock(&j->mu);
        return 1;
    }
    unref_locked(j);
    return 0;
}

/* Submits j and waits for it: 1 when done (status in j), 0 when the client hung up, -1 after
 * setting e (the engine refused it, or no progress for --timeout). */
static int job_run(serve_server *s, embed_job *j, int fd, serve_error *e) {
    j->refs = 2;
    if (rlx_engine_task_submit(s->engine, job_turn, j) != RLX_OK) {
        j->refs = 1;
        serve_error_set(e, 503, "server_error", "busy", "", "%s", rlx_last_error());
        e->retry_after = 1;
        return -1;
    }
    uint64_t seen = 0;
    double quiet_since = rlx__now_seconds();
    int result = 1;
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        const struct timespec until = rlx__deadline_in(EMBED_POLL_MS);
        pthread_cond_timedwait(&j->cv, &j->mu, &until);
        if (j->done)
            break;
        if (j->chunks != seen) {
            seen = j->chunks;
            quiet_since = rlx__now_seconds();
        }
        struct pollfd p = {.fd = fd};
        if (fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL))) {
            result = 0;
            break;
        }
        if (rlx__now_seconds() - quiet_since > s->timeout_s) {
            serve_error_set(e, 504, "server_error", "timeout", "", "no progress for %u s (--timeout)", s->timeout_s);
            result = -1;
            break;
        }
    }
    j->abandoned = !j->done; /* the task ends at its next turn */
    pthread_mutex_unlock(&j->mu);
    return result;
}

static embed_job *job_new(serve_server *s, uint32_t n_inputs, int pooling, int rank, serve_error *e) {
    embed_job *j = calloc(1, sizeof *j);
    if (!j || !(j->inputs = calloc(n_inputs, sizeof *j->inputs)) || !(j->lens = calloc(n_inputs, sizeof *j->lens)) ||
        !(j->acc = calloc((size_t)s->embedder->hidden, sizeof *j->acc))) {
        if (j) {
            free(j->inputs);
            free(j->lens);
        }
        free(j);
        serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    rlx__cond_init_monotonic(&j->cv);
    j->emb = s->embedder;
    j->n_inputs = n_inputs;
    j->pooling = pooling;
    j->rank = rank;
    j->refs = 1;
    return j;
}

/* Makes room for the results once the inputs are known; -1 after setting e. */
static int job_results(embed_job *j, serve_error *e) {
    size_t rows = j->n_inputs;
    if (j->pooling == SERVE_POOL_NONE && !j->rank)
        for (uint32_t i = rows = 0; i < j->n_inputs; i++)
            rows += j->lens[i];
    if (j->rank ? !(j->scores = calloc(j->n_inputs, sizeof *j->scores))
                : !(j->vectors = calloc(rows * (size_t)j->emb->hidden, sizeof *j->vectors)))
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    return 0;
}

/* Runs j to its end; -1 after setting e (its error, a refusal or a timeout), 0 when the client
 * left, 1 with the results in j. The connection's reference is dropped by the caller. */
static int job_finish(serve_server *s, embed_job *j, int fd, serve_error *e) {
    const int rc = job_run(s, j, fd, e);
    if (rc == 1 && j->status != RLX_OK) {
        const int busy = j->status == RLX_E_BUSY;
        serve_error_set(e, busy ? 503 : 500, "server_error", busy ? "shutting_down" : NULL, "", "%s", j->message);
        return -1;
    }
    return rc;
}

static void job_release(embed_job *j) {
    pthread_mutex_lock(&j->mu);
    unref_locked(j);
}

// ---- inputs ----

/* Whether a is a flat array of token ids and strings with at least one id: llama-server takes it
 * as one prompt, where an array of strings alone is several. */
static int mixed_prompt(const cJSON *a) {
    int ids = 0;
    for (const cJSON *x = a->child; x; x = x->next) {
        if (!cJSON_IsNumber(x) && !cJSON_IsString(x))
            return 0;
        ids |= cJSON_IsNumber(x);
    }
    return ids;
}

/* Appends the ids of one input item (a string, or a token id) to *ids; -1 after setting e. */
static int add_piece(serve_server *s, const cJSON *x, int add_special, uint32_t index, int32_t **ids, size_t *n,
                     serve_error *e) {
    const size_t cap = s->embedder->capacity;
    int32_t *more = NULL;
    size_t n_more = 0;
    if (cJSON_IsNumber(x)) {
        const double v = x->valuedouble;
        if (!(v >= 0 && v < (double)s->vocab) || v != floor(v))
            return serve_error_set(e, 400, "invalid_request_error", "invalid_value", "input",
                                   "input %u: %.17g is not a token id (ids are integers from 0 to %lld)", index, v,
                                   (long long)s->vocab - 1),
                   -1;
        if (!(more = malloc(sizeof *more)))
            return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
        more[0] = (int32_t)v;
        n_more = 1;
    } else {
        const char *text = cJSON_GetStringValue(x);
        const rlx_encode_options eo = {
            .size = sizeof eo, .parse_special = s->special_in_content, .max_ids = cap + 1, .add_special = add_special};
        if (rlx_tokenizer_encode_ex(s->tok, text, strlen(text), &eo, &more, &n_more, NULL) != RLX_OK)
            return serve_error_set(e, 400, "invalid_request_error", "invalid_value", "input",
                                   "input %u cannot be tokenized: %s", index, rlx_last_error()),
                   -1;
    }
    int32_t *grown = *n + n_more <= cap ? realloc(*ids, (*n + n_more + 1) * sizeof **ids) : NULL;
    if (grown) {
        if (n_more)
            memcpy(grown + *n, more, n_more * sizeof *more);
        *ids = grown;
        *n += n_more;
    }
    free(more);
    if (!grown && *n + n_more <= cap)
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    if (!grown)
        return serve_error_set(e, 400, "invalid_request_error", "input_too_large", "input",
                               "input %u is too large to process: over %zu tokens, the context of %zu positions "
                               "(raise it with -c or --slot-ctx)",
                               index, cap, cap),
               -1;
    return 0;
}

/* One input: a string, a token id, or an array of ids and strings. */
static int tokenize_input(serve_server *s, const cJSON *x, uint32_t index, embed_job *j, serve_error *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    if (cJSON_IsArray(x)) {
        for (const cJSON *p = x->child; p && rc == 0; p = p->next)
            rc = cJSON_IsNumber(p) || cJSON_IsString(p)
                     ? add_piece(s, p, 0, index, &ids, &n, e)
                     : serve_bad(e, "input", "'%s' must be %s",
                                 "a string, an array of strings, an array of token ids, or an array of those");
    } else {
        rc = add_piece(s, x, 1, index, &ids, &n, e);
    }
    if (rc == 0 && n == 0) {
        serve_error_set(e, 400, "invalid_request_error", "invalid_value", "input",
                        "input %u is empty: input content cannot be empty", index);
        rc = -1;
    }
    if (rc < 0) {
        free(ids);
        return -1;
    }
    j->inputs[index] = ids;
    j->lens[index] = (uint32_t)n;
    return 0;
}

/* The inputs of a request's input (or content) member as j's, tokenized; NULL after setting e. */
static embed_job *parse_inputs(serve_server *s, const cJSON *input, const char *name, int pooling, serve_error *e) {
    const int many = cJSON_IsArray(input) && !mixed_prompt(input);
    const int n = many ? cJSON_GetArraySize(input) : 1;
    if (!input || (!cJSON_IsString(input) && !cJSON_IsArray(input)))
        return serve_bad(e, name, "'%s' must be %s",
                         "a string, an array of strings, an array of token ids, or an array of those"),
               NULL;
    if (n == 0 || n > MAX_INPUTS)
        return serve_error_set(e, 400, "invalid_request_error", "invalid_value", name,
                               "'%s' has %d inputs: give 1 to %d", name, n, MAX_INPUTS),
               NULL;
    embed_job *j = job_new(s, (uint32_t)n, pooling, 0, e);
    if (!j)
        return NULL;
    uint32_t i = 0;
    size_t total = 0;
    for (const cJSON *x = many ? input->child : input; x && i < (uint32_t)n; x = x->next, i++) {
        const int typed = cJSON_IsString(x) || cJSON_IsArray(x) || cJSON_IsNumber(x);
        if (!typed)
            serve_bad(e, name, "'%s' must be %s",
                      "a string, an array of strings, an array of token ids, or an array of those");
        if (!typed || tokenize_input(s, x, i, j, e) < 0) {
            job_release(j);
            return NULL;
        }
        total += j->lens[i];
        if (!many)
            break;
    }
    if (pooling == SERVE_POOL_NONE && total > s->embedder->capacity) {
        serve_error_set(e, 400, "invalid_request_error", "input_too_large", name,
                        "with --pooling none the answer holds a vector per position: %zu positions in all are too "
                        "large, over the context of %u",
                        total, s->embedder->capacity);
        job_release(j);
        return NULL;
    }
    return j;
}

// ---- answers ----

/* llama-server's embd_normalize: -1 none, 0 max-abs scaled to int16's range, 1 taxicab, 2
 * Euclidean, p > 2 the p-norm. */
static void normalize(float *v, int64_t n, int how) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double a = fabs((double)v[i]);
        sum = how == 0 ? (a > sum ? a : sum) : how == 2 ? sum + a * a : sum + pow(a, how);
    }
    const double norm = how < 0 ? 1.0 : how == 0 ? sum / 32760.0 : how == 2 ? sqrt(sum) : pow(sum, 1.0 / how);
    const double scale = norm > 0.0 ? 1.0 / norm : 0.0;
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(v[i] * scale);
}

/* Appends the text of a string literal. */
#define PUT(b, literal) serve_buf_append((b), (literal), sizeof(literal) - 1)

static void append_floats(serve_buf *b, const float *v, int64_t n) {
    PUT(b, "[");
    for (int64_t i = 0; i < n; i++)
        serve_buf_printf(b, i ? ",%.9g" : "%.9g", (double)v[i]);
    PUT(b, "]");
}

/* The float32 bytes of v in base64, as OpenAI's encoding_format "base64" (little-endian). */
static void append_base64(serve_buf *b, const float *v, int64_t n) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = (const unsigned char *)v;
    const size_t len = (size_t)n * sizeof *v;
    PUT(b, "\"");
    for (size_t i = 0; i < len; i += 3) {
        const uint32_t w =
            (uint32_t)p[i] << 16 | (i + 1 < len ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < len ? (uint32_t)p[i + 2] : 0);
        const char q[4] = {digits[w >> 18 & 63], digits[w >> 12 & 63], i + 1 < len ? digits[w >> 6 & 63] : '=',
                           i + 2 < len ? digits[w & 63] : '='};
        serve_buf_append(b, q, 4);
    }
    PUT(b, "\"");
}

/* A JSON string of text, escaped by cJSON. */
static void append_string(serve_buf *b, const char *text) {
    cJSON *str = cJSON_CreateString(text);
    char *json = str ? cJSON_PrintUnformatted(str) : NULL;
    if (!json)
        b->failed = 1;
    else
        serve_buf_append(b, json, strlen(json));
    free(json);
    cJSON_Delete(str);
}

typedef struct embed_opts {
    int oai, base64, normalize;
    int64_t dims; /* the leading components kept (OpenAI's dimensions) */
    const char *model;
} embed_opts;

static char *embed_answer(const serve_server *s, embed_job *j, const embed_opts *o, serve_error *e) {
    size_t tokens = 0;
    serve_buf b = {0};
    serve_buf_printf(&b, "%s", o->oai ? "{\"object\":\"list\",\"data\":[" : "[");
    for (uint32_t i = 0; i < j->n_inputs; i++) {
        const uint32_t rows = j->pooling == SERVE_POOL_NONE ? j->lens[i] : 1;
        tokens += j->lens[i];
        serve_buf_printf(&b, "%s{\"index\":%u,", i ? "," : "", i);
        if (o->oai)
            serve_buf_printf(&b, "\"object\":\"embedding\",%s", o->base64 ? "\"encoding_format\":\"base64\"," : "");
        serve_buf_printf(&b, "%s", o->oai ? "\"embedding\":" : "\"embedding\":[");
        for (uint32_t r = 0; r < rows; r++) {
            float *v = out_row(j, i, r);
            for (int64_t k = 0; k < o->dims; k++)
                if (!isfinite(v[k])) {
                    serve_buf_free(&b);
                    return serve_error_set(e, 500, "server_error", NULL, "",
                                           "the hidden state of input %u is not finite", i),
                           NULL;
                }
            if (j->pooling != SERVE_POOL_NONE)
                normalize(v, o->dims, o->normalize);
            if (r)
                PUT(&b, ",");
            (o->base64 ? append_base64 : append_floats)(&b, v, o->dims);
        }
        serve_buf_printf(&b, "%s", o->oai ? "}" : "]}");
    }
    if (o->oai) {
        PUT(&b, "],\"model\":");
        append_string(&b, o->model ? o->model : s->model_id);
        serve_buf_printf(&b, ",\"usage\":{\"prompt_tokens\":%zu,\"total_tokens\":%zu}}", tokens, tokens);
    } else {
        PUT(&b, "]");
    }
    if (b.failed) {
        serve_buf_free(&b);
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), NULL;
    }
    return b.data;
}

/* An endpoint that is off answers as llama-server's does: 501, naming the flag. */
static int disabled(const serve_server *s, int rerank, serve_error *e) {
    if (rerank ? s->reranking : s->embedding)
        return 0;
    serve_error_set(e, 501, "not_supported_error", NULL, "",
                    rerank ? "This server does not support reranking. Start it with `--reranking`"
                           : "This server does not support embeddings. Start it with `--embeddings`");
    return 1;
}

char *serve_embeddings_answer(serve_server *s, int oai, const char *body, size_t len, int fd, serve_error *e) {
    if (disabled(s, 0, e))
        return NULL;
    cJSON *root = serve_parse_body(body, len, e);
    if (!root)
        return NULL;
    embed_opts o = {.oai = oai, .normalize = s->embd_normalize, .dims = s->embedder->hidden};
    const cJSON *input = serve_member(root, "input");
    const char *name = "input", *format = NULL;
    if (!input && (input = serve_member(root, "content")) != NULL) {
        o.oai = 0; /* llama-server's: "content" is its own field, answered in its own shape */
        name = "content";
    }
    double normalize_how = o.normalize, dims = (double)o.dims;
    embed_job *j = NULL;
    char *json = NULL;
    if (!input) {
        serve_bad(e, "input", "'%s' is required: %s", "the text or token ids to embed");
    } else if (serve_get_string(root, "encoding_format", &format, e) >= 0 &&
               serve_get_integer(root, "embd_normalize", -1, SERVE_MAX_NORM_P, &normalize_how, e) >= 0 &&
               serve_get_integer(root, "dimensions", 1, (double)o.dims, &dims, e) >= 0 &&
               serve_get_string(root, "model", &o.model, e) >= 0) {
        if (format && strcmp(format, "float") != 0 && strcmp(format, "base64") != 0)
            serve_bad(e, "encoding_format", "'%s' must be %s", "\"float\" or \"base64\"");
        else if (o.oai && s->pooling == SERVE_POOL_NONE)
            serve_error_set(e, 400, "invalid_request_error", "invalid_value", "",
                            "Pooling type 'none' is not OAI compatible: /v1/embeddings answers a vector per input "
                            "(start the server with another --pooling, or ask /embeddings)");
        else
            j = parse_inputs(s, input, name, s->pooling, e);
    }
    o.base64 = format && strcmp(format, "base64") == 0 && o.oai;
    o.normalize = (int)normalize_how;
    o.dims = (int64_t)dims;
    if (j && job_results(j, e) == 0) {
        const int rc = job_finish(s, j, fd, e);
        json = rc == 1 ? embed_answer(s, j, &o, e) : NULL;
        if (rc == 0)
            e->status = 0; /* nobody to answer */
    }
    if (j)
        job_release(j);
    cJSON_Delete(root);
    return json;
}

// ---- rerank ----

/* The prompt of a reranker GGUF's template (tmpl) into text: {query} and {document} replaced
 * wherever they are, as llama-server's format_prompt_rerank does, the template's own pieces the
 * markup (malloc'd spans, n_spans of them). */
static void template_prompt(const char *tmpl, const char *query, const char *doc, serve_buf *text,
                            rlx_text_span **spans, size_t *n_spans) {
    size_t n = 1;
    for (const char *p = tmpl; (p = strchr(p, '{')) != NULL; p++)
        n += strncmp(p, "{query}", 7) == 0 || strncmp(p, "{document}", 10) == 0;
    if (!(*spans = malloc(n * sizeof **spans))) {
        text->failed = 1;
        return;
    }
    *n_spans = 0;
    const char *p = tmpl, *piece = tmpl;
    for (; *p; p++) {
        const int q = strncmp(p, "{query}", 7) == 0, d = !q && strncmp(p, "{document}", 10) == 0;
        if (!q && !d)
            continue;
        (*spans)[(*n_spans)++] = (rlx_text_span){text->len, (size_t)(p - piece)};
        serve_buf_append(text, piece, (size_t)(p - piece));
        serve_buf_append(text, q ? query : doc, strlen(q ? query : doc));
        p += q ? 6 : 9;
        piece = p + 1;
    }
    (*spans)[(*n_spans)++] = (rlx_text_span){text->len, (size_t)(p - piece)};
    serve_buf_append(text, piece, (size_t)(p - piece));
}

/* The reranking prompt of one document, its template's markup the only text whose special
 * tokens count: the model's GGUF template, or Qwen3-Reranker's; -1 after setting e. */
static int rerank_prompt(serve_server *s, const char *instruction, const char *query, const char *doc, uint32_t index,
                         embed_job *j, serve_error *e) {
    serve_buf text = {0};
    rlx_text_span fixed[2], *markup = fixed;
    size_t n_markup = 2;
    if (s->embedder->rerank_template) {
        template_prompt(s->embedder->rerank_template, query, doc, &text, &markup, &n_markup);
    } else {
        serve_buf_append(&text, RERANK_SYSTEM, strlen(RERANK_SYSTEM));
        const size_t head = text.len;
        serve_buf_printf(&text, "<Instruct>: ");
        serve_buf_append(&text, instruction, strlen(instruction));
        serve_buf_printf(&text, "\n<Query>: ");
        serve_buf_append(&text, query, strlen(query));
        serve_buf_printf(&text, "\n<Document>: ");
        serve_buf_append(&text, doc, strlen(doc));
        const size_t tail = text.len;
        serve_buf_append(&text, RERANK_END, strlen(RERANK_END));
        fixed[0] = (rlx_text_span){0, head};
        fixed[1] = (rlx_text_span){tail, text.len - tail};
    }
    if (text.failed) {
        serve_buf_free(&text);
        if (markup != fixed)
            free(markup);
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    }
    const rlx_encode_options eo = {.size = sizeof eo,
                                   .special_spans = s->special_in_content ? NULL : markup,
                                   .n_special_spans = n_markup,
                                   .parse_special = 1,
                                   .max_ids = s->embedder->capacity + 1};
    int32_t *ids = NULL;
    size_t n = 0;
    const rlx_status rc = rlx_tokenizer_encode_ex(s->tok, text.data, text.len, &eo, &ids, &n, NULL);
    serve_buf_free(&text);
    if (markup != fixed)
        free(markup);
    if (rc != RLX_OK)
        return serve_error_set(e, 400, "invalid_request_error", "invalid_value", "documents",
                               "document %u cannot be tokenized: %s", index, rlx_last_error()),
               -1;
    if (n > s->embedder->capacity) {
        free(ids);
        return serve_error_set(e, 400, "invalid_request_error", "input_too_large", "documents",
                               "document %u with the query is too large to process: over %u tokens, the context "
                               "(raise it with -c or --slot-ctx)",
                               index, s->embedder->capacity),
               -1;
    }
    j->inputs[index] = ids;
    j->lens[index] = (uint32_t)n;
    return 0;
}

typedef struct ranked {
    uint32_t index;
    double score;
} ranked;

static int by_score(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    return x->score != y->score ? (x->score < y->score ? 1 : -1) : (x->index > y->index) - (x->index < y->index);
}

static char *rerank_answer(const serve_server *s, const embed_job *j, const cJSON *docs, int tei, int return_text,
                           uint32_t top_n, const char *model, serve_error *e) {
    ranked *order = malloc(j->n_inputs * sizeof *order);
    if (!order)
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), NULL;
    size_t tokens = 0;
    for (uint32_t i = 0; i < j->n_inputs; i++) {
        order[i] = (ranked){i, j->scores[i]};
        tokens += j->lens[i];
    }
    qsort(order, j->n_inputs, sizeof *order, by_score);
    serve_buf b = {0};
    serve_buf_printf(&b, "%s", tei ? "[" : "{\"object\":\"list\",\"results\":[");
    for (uint32_t i = 0; i < j->n_inputs && i < top_n; i++) {
        serve_buf_printf(&b, "%s{\"index\":%u,\"%s\":%.17g", i ? "," : "", order[i].index,
                         tei ? "score" : "relevance_score", order[i].score);
        if (return_text) {
            PUT(&b, ",\"text\":");
            append_string(&b, cJSON_GetArrayItem(docs, (int)order[i].index)->valuestring);
        }
        PUT(&b, "}");
    }
    free(order);
    if (tei) {
        PUT(&b, "]");
    } else {
        PUT(&b, "],\"model\":");
        append_string(&b, model ? model : s->model_id);
        serve_buf_printf(&b, ",\"usage\":{\"prompt_tokens\":%zu,\"total_tokens\":%zu}}", tokens, tokens);
    }
    if (b.failed) {
        serve_buf_free(&b);
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), NULL;
    }
    return b.data;
}

char *serve_rerank_answer(serve_server *s, const char *body, size_t len, int fd, serve_error *e) {
    if (disabled(s, 1, e))
        return NULL;
    cJSON *root = serve_parse_body(body, len, e);
    if (!root)
        return NULL;
    const char *query = NULL, *instruction = RERANK_INSTRUCTION, *model = NULL;
    const cJSON *docs = serve_member(root, "documents");
    const int tei = !docs && serve_member(root, "texts");
    const char *docs_name = tei ? "texts" : "documents";
    docs = tei ? serve_member(root, "texts") : docs;
    int return_text = 0;
    double top_n = MAX_INPUTS;
    embed_job *j = NULL;
    char *json = NULL;
    int rc = serve_get_string(root, "query", &query, e);
    if (rc == 0)
        rc = serve_bad(e, "query", "'%s' is required: %s", "the text the documents are ranked against");
    if (rc > 0 &&
        (serve_get_string(root, "instruction", &instruction, e) < 0 ||
         serve_get_integer(root, "top_n", 0, 1e15, &top_n, e) < 0 ||
         serve_get_bool(root, "return_text", &return_text, e) < 0 || serve_get_string(root, "model", &model, e) < 0))
        rc = -1;
    if (rc > 0 && s->embedder->rerank_template && serve_member(root, "instruction"))
        rc = serve_bad(e, "instruction", "'%s' cannot be given: %s",
                       "the model's rerank template (GGUF tokenizer.chat_template.rerank) fixes the instruction, "
                       "as llama-server reads it");
    int n = cJSON_IsArray(docs) ? cJSON_GetArraySize(docs) : 0;
    for (const cJSON *d = rc > 0 && n ? docs->child : NULL; d; d = d->next)
        n = cJSON_IsString(d) ? n : 0;
    if (rc > 0 && (n == 0 || n > MAX_INPUTS)) {
        serve_error_set(e, 400, "invalid_request_error", "invalid_value", docs_name,
                        "'%s' must be a non-empty array of at most %d strings", docs_name, MAX_INPUTS);
        rc = -1;
    }
    if (rc > 0 && (j = job_new(s, (uint32_t)n, SERVE_POOL_LAST, 1, e)) != NULL) {
        int i = 0;
        for (const cJSON *d = docs->child; d && rc > 0; d = d->next, i++)
            if (rerank_prompt(s, instruction, query, d->valuestring, (uint32_t)i, j, e) < 0)
                rc = -1;
        if (rc > 0 && job_results(j, e) == 0) {
            const int ran = job_finish(s, j, fd, e);
            json = ran == 1 ? rerank_answer(s, j, docs, tei, return_text && tei,
                                            (uint32_t)(top_n < MAX_INPUTS ? top_n : MAX_INPUTS), model, e)
                            : NULL;
            if (ran == 0)
                e->status = 0;
        }
    }
    if (j)
        job_release(j);
    cJSON_Delete(root);
    return json;
}
