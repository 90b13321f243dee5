/* rlx serve's OpenAI side: a request body becomes an engine request, the engine's events become
 * text, and the text becomes OpenAI's response objects or server-sent event chunks.
 *
 * A job is shared by two threads: the connection's (which parsed it and answers the client)
 * and the engine's worker (which delivers its events). The worker turns tokens into text at
 * once, streaming detokenizer then stop strings, so a completed stop string ends the request in
 * the same step (its callback returns 1) and no byte of it is ever shown. Either side may be
 * the last to let go of the job (a client gone mid-stream, or the engine's DONE after it), so
 * it is reference-counted. */
#include <cjson/cJSON.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common.h"
#include "output.h"
#include "job.h"
#include "serve.h"

/* How often a waiting connection looks whether its client hung up. */
#define HANGUP_POLL_MS 20
/* What a choice owns alone, its reply (job.h). */
static void choice_free(serve_job *c) {
    rlx_detok_destroy(c->detok);
    rlx_stop_matcher_destroy(c->stopper);
    serve_buf_free(&c->text);
    serve_buf_free(&c->raw);
    free(c->lps);
}

/* Frees choice 0, the request and every other choice. */
static void job_free(serve_job *j) {
    for (uint32_t i = 1; j->choices && i < j->n_choices; i++)
        if (j->choices[i]) {
            choice_free(j->choices[i]);
            free(j->choices[i]);
        }
    free(j->choices);
    choice_free(j);
    for (size_t i = 0; i < j->n_stops; i++)
        free(j->stops[i]);
    free(j->biases);
    free(j->prompt);
    free(j->model);
    rlx_grammar_destroy(j->grammar);
    cJSON_Delete(j->tools);
    cJSON_Delete(j->output);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Drops one reference of choice 0 (j); the caller holds its mu, which is released. */
static void unref_locked(serve_job *j) {
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last)
        job_free(j);
}

// ---- the engine's events ----

/* Decoded text through the stop strings into the reply; the caller holds mu. */
static void take_text(serve_job *j, const char *text, size_t len) {
    if (j->stop_hit)
        return;
    if (j->stopper)
        serve_buf_append(&j->raw, text, len);
    if (j->stopper && rlx_stop_matcher_push(j->stopper, text, len, &text, &len, &j->stop_hit) != RLX_OK) {
        j->out_of_memory = 1;
        return;
    }
    serve_buf_append(&j->text, text, len);
}

static void add_logprobs(serve_job *j, const rlx_engine_event *ev, size_t offset) {
    if (j->n_lps == j->cap_lps) {
        size_t cap = j->cap_lps ? 2 * j->cap_lps : 32;
        token_lp *grown = realloc(j->lps, cap * sizeof *grown);
        if (!grown) {
            j->out_of_memory = 1;
            return;
        }
        j->lps = grown;
        j->cap_lps = cap;
    }
    token_lp *lp = &j->lps[j->n_lps++];
    lp->token = ev->token;
    lp->logprob = ev->logprob;
    lp->n_top = ev->n_top < MAX_TOP ? ev->n_top : MAX_TOP;
    memcpy(lp->top_ids, ev->top_ids, lp->n_top * sizeof *lp->top_ids);
    memcpy(lp->top_logprobs, ev->top_logprobs, lp->n_top * sizeof *lp->top_logprobs);
    lp->text_offset = offset;
}

static int on_event(void *ctx, const rlx_engine_event *ev) {
    serve_job *j = ctx, *g = j->group;
    const char *text;
    size_t len;
    pthread_mutex_lock(&g->mu);
    clock_gettime(CLOCK_MONOTONIC, &g->last_news);
    if (ev->kind == RLX_ENGINE_TOKEN) {
        if (!j->stop_hit && !j->out_of_memory) {
            size_t offset = j->decoded;
            if (rlx_detok_push(j->detok, ev->token, &text, &len) == RLX_OK) {
                j->decoded += len;
                take_text(j, text, len);
            }
            /* the token that completes a stop string belongs to no text the client sees */
            if (j->logprobs && !j->stop_hit)
                add_logprobs(j, ev, offset);
        }
        int stop = j->stop_hit || j->out_of_memory;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return stop;
    }
    if (!j->stop_hit && rlx_detok_flush(j->detok, &text, &len) == RLX_OK)
        take_text(j, text, len);
    if (j->stopper && !j->stop_hit) {
        rlx_stop_matcher_flush(j->stopper, &text, &len);
        serve_buf_append(&j->text, text, len);
    }
    j->done = 1;
    j->finish = ev->finish;
    j->status = ev->status;
    snprintf(j->message, sizeof j->message, "%s", ev->message ? ev->message : "");
    j->usage = ev->usage;
    pthread_cond_broadcast(&g->cv);
    serve_server *srv = j->server;
    pthread_mutex_lock(&srv->latency_mu);
    srv->latency.requests++;
    srv->latency.queue += ev->usage.queue_seconds;
    srv->latency.prompt += ev->usage.prompt_seconds;
    srv->latency.decode += ev->usage.decode_seconds;
    pthread_mutex_unlock(&srv->latency_mu);
    unref_locked(g);
    return 0;
}

// ---- parsing a request ----

/* temperature, top_p, top_k, min_p, seed, the penalties: the server's defaults when absent
 * (OpenAI's, temperature 1, top_p 1, nothing else, unless its sampling flags say otherwise),
 * greedy at temperature 0. */
static int parse_sampling(serve_job *j, const cJSON *root, serve_error *e) {
    rlx_sampler_params *p = &j->sampler;
    *p = j->server->sampling;
    double v;
    int rc;
    if ((rc = serve_get_number(root, "temperature", 0, 2, &v, e)) < 0)
        return -1;
    if (rc) {
        p->temperature = (float)v;
        p->greedy = v == 0;
    }
    if ((rc = serve_get_number(root, "top_p", 0, 1, &v, e)) < 0)
        return -1;
    /* OpenAI takes 0: the limit of ever smaller nucleus sets is the argmax; so is a top_p too
     * small for a float (below 1.4e-45), which keeps the most likely token alone */
    if (rc && (float)v == 0)
        p->greedy = 1;
    else if (rc)
        p->top_p = (float)v;
    if ((rc = serve_get_integer(root, "top_k", 0, INT32_MAX, &v, e)) < 0)
        return -1;
    if (rc)
        p->top_k = (int32_t)v;
    /* repeat_penalty (and repeat_last_n below) are llama.cpp's extensions */
    const struct {
        const char *name;
        double lo, hi;
        float *target;
    } floats[] = {{"min_p", 0, 1, &p->min_p},
                  {"presence_penalty", -2, 2, &p->presence_penalty},
                  {"frequency_penalty", -2, 2, &p->frequency_penalty},
                  {"repeat_penalty", 0.01, 100, &p->repeat_penalty}};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        if ((rc = serve_get_number(root, floats[i].name, floats[i].lo, floats[i].hi, &v, e)) < 0)
            return -1;
        if (rc)
            *floats[i].target = (float)v;
    }
    if ((rc = serve_get_integer(root, "repeat_last_n", -1, INT32_MAX, &v, e)) < 0)
        return -1;
    /* a window wider than a slot sees the whole context, as -1 does: clamped, it means the same
     * and the sampler's window is never wider than the positions the server holds */
    if (rc && j->server->slot_positions && v > j->server->slot_positions)
        v = j->server->slot_positions;
    if (rc)
        p->repeat_last_n = (int32_t)v;
    /* OpenAI's seeds are signed 64-bit; a negative one wraps to the same bits */
    if ((rc = serve_get_integer(root, "seed", -9007199254740992.0, 9007199254740992.0, &v, e)) < 0)
        return -1;
    p->seed = rc ? (uint64_t)(int64_t)v : j->server->has_seed ? j->server->sampling.seed : app_fresh_seed();
    return 0;
}

/* The most logit_bias entries a request may give (OpenAI takes 300). */
#define SERVE_MAX_LOGIT_BIAS 1024

/* logit_bias: OpenAI's object of token ids (decimal strings) to biases in [-100, 100], added to
 * the logits before sampling; or llama.cpp's array of [id, bias] pairs. A bias of false (as
 * llama.cpp takes it) bans the token. */
static int parse_logit_bias(serve_job *j, const cJSON *root, serve_error *e) {
    const cJSON *lb = serve_member(root, "logit_bias");
    if (!lb)
        return 0;
    static const char what[] = "an object of token ids to numbers from -100 to 100, or an array of [id, bias] pairs";
    if ((!cJSON_IsObject(lb) && !cJSON_IsArray(lb)) || cJSON_GetArraySize(lb) > SERVE_MAX_LOGIT_BIAS)
        return serve_bad(e, "logit_bias", "'%s' must be %s (at most 1024)", what);
    const int n = cJSON_GetArraySize(lb);
    if (n == 0)
        return 0;
    if (!(j->biases = malloc((size_t)n * sizeof *j->biases)))
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    int k = 0;
    for (const cJSON *it = lb->child; it; it = it->next, k++) {
        const cJSON *bias = it;
        double token = -1;
        if (cJSON_IsArray(lb)) {
            const cJSON *id = cJSON_GetArrayItem(it, 0);
            bias = cJSON_GetArraySize(it) == 2 ? cJSON_GetArrayItem(it, 1) : NULL;
            token = cJSON_IsNumber(id) ? id->valuedouble : -1;
        } else if (it->string && *it->string && strlen(it->string) <= 10 &&
                   strspn(it->string, "0123456789") == strlen(it->string)) {
            token = strtod(it->string, NULL); /* decimal digits only: not "1e3", " 5" or "0x10" */
        }
        if (token < 0 || token != floor(token) || token >= (double)j->server->vocab || !bias ||
            !(cJSON_IsFalse(bias) || (cJSON_IsNumber(bias) && bias->valuedouble >= -100 && bias->valuedouble <= 100))) {
            serve_error_set(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                            "'logit_bias' must be %s, with ids from 0 to %lld", what, (long long)j->server->vocab - 1);
            return -1;
        }
        j->biases[k] = (rlx_logit_bias){(int32_t)token, cJSON_IsFalse(bias) ? -INFINITY : (float)bias->valuedouble};
    }
    j->sampler.logit_bias = j->biases;
    j->sampler.n_logit_bias = (uint32_t)n;
    return 0;
}

/* Known OpenAI fields whose meaning rlx does not provide: refused rather than ignored, since a
 * client that sets them expects a different answer. */
static int parse_unsupported(const cJSON *root, serve_error *e) {
    const cJSON *item;
    if ((item = serve_member(root, "echo")) && !cJSON_IsFalse(item))
        return serve_bad(e, "echo", "'%s' is not supported: %s", "the prompt is not echoed back");
    if ((item = serve_member(root, "best_of")) && !(cJSON_IsNumber(item) && item->valuedouble == 1))
        return serve_bad(e, "best_of", "'%s' is not supported: %s", "one completion is generated per request");
    if ((item = serve_member(root, "suffix")) && !(cJSON_IsString(item) && !*item->valuestring))
        return serve_bad(e, "suffix", "'%s' is not supported: %s",
                         "rlx does not insert text between a prefix and a suffix");
    return 0;
}

/* The longest stop string: the matcher looks for every stop string at each byte generated, in the
 * engine's worker, so its cost per token grows with their length (text/stop.c). */
#define SERVE_MAX_STOP_BYTES 256

static int parse_stop(serve_job *j, const cJSON *root, serve_error *e) {
    const char *name = j->ep == SERVE_ANTHROPIC ? "stop_sequences" : "stop"; /* Anthropic's name for it */
    const cJSON *stop = serve_member(root, name);
    if (!stop)
        return 0;
    const cJSON *one = cJSON_IsString(stop) ? stop : NULL;
    if (!one && (!cJSON_IsArray(stop) || cJSON_GetArraySize(stop) > APP_MAX_STOPS)) {
        char what[64];
        snprintf(what, sizeof what, "a string or an array of at most %d strings", APP_MAX_STOPS);
        return serve_bad(e, name, "'%s' must be %s", what);
    }
    for (const cJSON *s = one ? one : stop->child; s; s = one ? NULL : s->next) {
        if (!cJSON_IsString(s) || !*s->valuestring || strlen(s->valuestring) > SERVE_MAX_STOP_BYTES) {
            char what[64];
            snprintf(what, sizeof what, "non-empty strings of at most %d bytes", SERVE_MAX_STOP_BYTES);
            return serve_bad(e, name, "'%s' must hold %s", what);
        }
        if (!(j->stops[j->n_stops] = strdup(s->valuestring))) {
            serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
            return -1;
        }
        j->n_stops++;
    }
    return 0;
}

/* logprobs: chat's is a boolean with top_logprobs beside it, completions' the number of
 * alternatives (0 = the chosen token's log-probability alone). */
static int parse_logprobs(serve_job *j, const cJSON *root, serve_error *e) {
    double v;
    int rc;
    if (j->ep == SERVE_LLAMA_COMPLETION) { /* llama-server's n_probs: the alternatives of each token */
        if ((rc = serve_get_integer(root, "n_probs", 0, MAX_TOP, &v, e)) < 0)
            return -1;
        j->logprobs = rc && v > 0;
        j->top_logprobs = j->logprobs ? (uint32_t)v : 0;
        return 0;
    }
    if (j->ep == SERVE_COMPLETION) {
        if ((rc = serve_get_integer(root, "logprobs", 0, MAX_TOP, &v, e)) < 0)
            return -1;
        j->logprobs = rc;
        j->top_logprobs = rc ? (uint32_t)v : 0;
        return 0;
    }
    if (serve_get_bool(root, "logprobs", &j->logprobs, e) < 0 ||
        (rc = serve_get_integer(root, "top_logprobs", 0, MAX_TOP, &v, e)) < 0)
        return -1;
    if (rc && !j->logprobs)
        return serve_bad(e, "top_logprobs", "'%s' needs %s", "\"logprobs\": true");
    j->top_logprobs = rc ? (uint32_t)v : 0;
    return 0;
}

/* A message's content: a string, null, or an array of text parts (joined). */
static int message_content(const cJSON *msg, char **out, serve_error *e) {
    const cJSON *c = serve_member(msg, "content");
    *out = NULL;
    if (!c)
        return 0;
    if (cJSON_IsString(c))
        return (*out = strdup(c->valuestring))
                   ? 0
                   : (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1);
    if (!cJSON_IsArray(c))
        return serve_bad(e, "messages", "'%s' content must be %s", "a string or an array of text parts");
    serve_buf b = {0};
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) {
            serve_buf_free(&b);
            return serve_bad(e, "messages", "'%s' content parts must be %s",
                             "{\"type\": \"text\", \"text\": \"...\"} (images, audio and files are not supported)");
        }
        serve_buf_append(&b, text->valuestring, strlen(text->valuestring));
    }
    serve_buf_append(&b, "", 1);
    if (b.failed) {
        serve_buf_free(&b);
        serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
        return -1;
    }
    *out = b.data;
    return 0;
}

/* The messages as JSON for a chat with tools: each validated message (role, flattened content,
 * reasoning_content) with its tool_calls, tool_call_id and name; a tool call's arguments, which
 * OpenAI sends as a JSON string, become the object templates expect (as llama.cpp does). NULL
 * when out of memory. */
static char *tool_messages_json(const cJSON *msgs, const rlx_chat_message *m) {
    cJSON *arr = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *msg = msgs->child; arr && msg; msg = msg->next, i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o) || !cJSON_AddStringToObject(o, "role", m[i].role) ||
            !cJSON_AddStringToObject(o, "content", m[i].content ? m[i].content : "") ||
            (m[i].reasoning_content && !cJSON_AddStringToObject(o, "reasoning_content", m[i].reasoning_content)))
            goto fail;
        static const char *const keys[] = {"tool_calls", "tool_call_id", "name"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            const cJSON *v = serve_member(msg, keys[k]);
            cJSON *copy = v ? cJSON_Duplicate(v, 1) : NULL;
            if (v && (!copy || !cJSON_AddItemToObject(o, keys[k], copy))) {
                cJSON_Delete(copy);
                goto fail;
            }
        }
        const cJSON *calls = serve_member(o, "tool_calls");
        for (cJSON *call = cJSON_IsArray(calls) ? calls->child : NULL; call; call = call->next) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
            cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            if (cJSON_IsObject(parsed))
                cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
            else
                cJSON_Delete(parsed);
        }
    }
    char *text = arr ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    return text;
fail:
    cJSON_Delete(arr);
    return NULL;
}

/* Whether the request needs the messages as JSON: tools, or tool calls and results in messages. */
static int has_tools(const cJSON *tools, const cJSON *msgs) {
    if (tools)
        return 1;
    for (const cJSON *msg = msgs->child; msg; msg = msg->next)
        if (serve_member(msg, "tool_calls") || serve_member(msg, "tool_call_id") || serve_member(msg, "name"))
            return 1;
    return 0;
}

/* messages through the model's chat template (or --chat-template-file's); chat_template_kwargs
 * (llama.cpp's extension) become template variables, enable_thinking picking Qwen3's non-thinking
 * mode; tools and tool calls reach the template too. *markup: the spans of the template's own text. */
int serve_render_chat(const serve_server *s, const cJSON *root, char **prompt, rlx_text_span **markup, size_t *n_markup,
                      serve_error *e) {
    const cJSON *msgs = serve_member(root, "messages");
    int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : 0;
    if (n == 0)
        return serve_bad(e, "messages", "'%s' must be %s", "a non-empty array of messages");
    int think = s->think;
    const cJSON *kwargs = serve_member(root, "chat_template_kwargs");
    if (kwargs && (!cJSON_IsObject(kwargs) || serve_get_bool(kwargs, "enable_thinking", &think, e) < 0))
        return serve_bad(e, "chat_template_kwargs", "'%s' must be %s", "an object with a boolean enable_thinking");
    rlx_chat_message *m = calloc((size_t)n, sizeof *m);
    char **contents = calloc((size_t)n, sizeof *contents);
    int rc = m && contents ? 0 : (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1);
    int i = 0;
    for (const cJSON *msg = msgs->child; msg && rc == 0; msg = msg->next, i++) {
        static const char *const roles[] = {"system", "user", "assistant", "tool"};
        const cJSON *role = cJSON_IsObject(msg) ? cJSON_GetObjectItemCaseSensitive(msg, "role") : NULL;
        const char *r = cJSON_IsString(role) ? role->valuestring : "";
        m[i].role = strcmp(r, "developer") == 0 ? "system" : NULL; /* OpenAI's newer name for system */
        for (size_t k = 0; k < sizeof roles / sizeof roles[0] && !m[i].role; k++)
            if (strcmp(r, roles[k]) == 0)
                m[i].role = roles[k];
        if (!m[i].role) {
            rc = serve_bad(e, "messages", "'%s' entries need a role of %s",
                           "system, developer, user, assistant or tool");
            break;
        }
        const char *reasoning = NULL;
        if (serve_get_string(msg, "reasoning_content", &reasoning, e) < 0 ||
            message_content(msg, &contents[i], e) < 0) {
            rc = -1;
            break;
        }
        m[i].content = contents[i];
        m[i].reasoning_content = reasoning;
    }
    const cJSON *tools = serve_member(root, "tools");
    if (rc == 0 && tools && !cJSON_IsArray(tools))
        rc = serve_bad(e, "tools", "'%s' must be %s", "an array of tool definitions");
    /* tool_choice "none": the model is not shown tools it may not call */
    const cJSON *choice = serve_member(root, "tool_choice");
    if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none"))
        tools = NULL;
    int with_tools = rc == 0 && has_tools(tools, msgs);
    char *kwargs_json = kwargs ? cJSON_PrintUnformatted(kwargs) : NULL;
    char *messages_json = with_tools ? tool_messages_json(msgs, m) : NULL;
    char *tools_json = with_tools && tools ? cJSON_PrintUnformatted(tools) : NULL;
    if (rc == 0 && ((kwargs && !kwargs_json) || (with_tools && !messages_json) || (with_tools && tools && !tools_json)))
        rc = (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1);
    app_chat chat = with_tools ? (app_chat){.messages_json = messages_json, .tools_json = tools_json}
                               : (app_chat){.msgs = m, .n = (size_t)n};
    if (rc == 0 &&
        app_chat_render(s->tok, &chat, think, s->chat_template, kwargs_json, prompt, markup, n_markup) != RLX_OK) {
        serve_error_set(e, 400, "invalid_request_error", "unsupported_chat_template", "messages",
                        "cannot apply this model's chat template (%s); /v1/completions takes raw text",
                        rlx_last_error());
        rc = -1;
    }
    free(kwargs_json);
    free(messages_json);
    free(tools_json);
    for (int k = 0; contents && k < n; k++)
        free(contents[k]);
    free(contents);
    free(m);
    return rc;
}

/* A prompt of token ids: the array holds integers only. */
static int prompt_ids(serve_job *j, const cJSON *arr, serve_error *e) {
    int n = cJSON_GetArraySize(arr);
    if (!(j->prompt = malloc((size_t)(n ? n : 1) * sizeof *j->prompt))) {
        serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
        return -1;
    }
    for (const cJSON *t = arr->child; t; t = t->next) {
        double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (v != floor(v) || v < 0 || v >= (double)j->server->vocab) {
            char what[96];
            snprintf(what, sizeof what, "token ids from 0 to %lld", (long long)j->server->vocab - 1);
            return serve_bad(e, "prompt", "'%s' must hold %s", what);
        }
        j->prompt[j->n_prompt++] = (int32_t)v;
    }
    return 0;
}

/* The prompt of /v1/completions: a string, an array of one string, of token ids, or of one
 * array of ids. Several prompts in one request are refused (n is 1 here, too). */
static int completion_prompt(serve_job *j, const cJSON *root, char **text, serve_error *e) {
    const cJSON *p = serve_member(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(p->child))
        p = p->child;
    if (cJSON_IsString(p))
        return (*text = strdup(p->valuestring))
                   ? 0
                   : (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1);
    if (cJSON_IsArray(p) && (!p->child || cJSON_IsNumber(p->child)))
        return prompt_ids(j, p, e);
    return serve_bad(e, "prompt", "'%s' must be %s", "a string or an array of token ids (one prompt per request)");
}

void serve_make_id(char *out, size_t size, const char *prefix) {
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        uint64_t s = app_fresh_seed();
        memcpy(r, &s, sizeof s);
        memset(r + sizeof s, 0, sizeof r - sizeof s);
    }
    int n = snprintf(out, size, "%s", prefix);
    for (size_t i = 0; i < sizeof r && (size_t)n + 2 < size; i++)
        n += snprintf(out + n, size - (size_t)n, "%02x", r[i]);
}

/* Everything of a request but the prompt. */
static int parse_options(serve_job *j, const cJSON *root, serve_error *e) {
    serve_server *s = j->server;
    const char *model = s->model_id;
    double v;
    int rc;
    if (serve_get_string(root, "model", &model, e) < 0 || serve_get_bool(root, "stream", &j->stream, e) < 0 ||
        serve_get_bool(root, "ignore_eos", &j->ignore_eos, e) < 0)
        return -1;
    if (!(j->model = strdup(model)))
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    const cJSON *so = serve_member(root, "stream_options");
    if (so && (!cJSON_IsObject(so) || serve_get_bool(so, "include_usage", &j->include_usage, e) < 0))
        return serve_bad(e, "stream_options", "'%s' must be %s", "an object with a boolean include_usage");
    /* the choices run side by side, one slot each, as llama-server bounds its n_cmpl (whose
     * other name n is) by its slots */
    const char *n_name = j->ep == SERVE_LLAMA_COMPLETION && serve_member(root, "n_cmpl") ? "n_cmpl" : "n";
    if ((rc = serve_get_integer(root, n_name, 1, s->n_slots, &v, e)) < 0) {
        char what[96];
        snprintf(what, sizeof what, "an integer from 1 to %u (the server's slots, --parallel)", s->n_slots);
        return serve_bad(e, n_name, "'%s' must be %s", what);
    }
    j->n_choices = rc ? (uint32_t)v : 1;
    const double limit = s->max_tokens_limit ? s->max_tokens_limit : (double)(UINT32_MAX - 1);
    /* llama-server's /completion generates until the end by default, as chat does here */
    j->max_tokens = j->ep == SERVE_COMPLETION ? s->completion_default : s->chat_default;
    if (s->max_tokens_limit && (j->max_tokens == 0 || j->max_tokens > s->max_tokens_limit))
        j->max_tokens = s->max_tokens_limit;
    for (int k = 0; k < 2; k++) { /* max_completion_tokens is OpenAI's newer name and wins */
        const char *name = k ? "max_completion_tokens" : "max_tokens";
        if ((rc = serve_get_integer(root, name, 1, limit, &v, e)) < 0)
            return -1;
        if (rc)
            j->max_tokens = (uint32_t)v;
    }
    /* llama-server's n_predict: -1 to the end of the slot (or --max-tokens-limit) */
    if (j->ep == SERVE_LLAMA_COMPLETION && (rc = serve_get_integer(root, "n_predict", -1, limit, &v, e)) != 0) {
        if (rc < 0)
            return -1;
        if (v == 0)
            return serve_bad(e, "n_predict", "'%s' of 0 is not supported: %s",
                             "rlx generates at least one token (give -1 for the end of the slot)");
        j->max_tokens = v < 0 ? s->max_tokens_limit : (uint32_t)v;
    }
    return parse_unsupported(root, e) < 0 || parse_sampling(j, root, e) < 0 || parse_logit_bias(j, root, e) < 0 ||
                   parse_stop(j, root, e) < 0 || parse_logprobs(j, root, e) < 0
               ? -1
               : 0;
}

/* A prompt's ids into *ids, *n: a rendered chat (the template's markup spans alone special,
 * unless --special-in-content) or a raw completion prompt; -1 after setting e. A prompt must
 * leave a slot one position, so its encoding stops past slot_positions - 1 ids: an over-long
 * prompt costs the tokens of a slot, not of the body. Special tokens in a raw completion prompt
 * are parsed, and the model's BOS added where it wants one, as llama-server and Hugging Face's
 * tokenizer(text) do; in chat messages they are text unless --special-in-content, and the
 * template writes its own BOS. */
static int encode_prompt(const serve_server *s, int chat, const char *text, const rlx_text_span *markup,
                         size_t n_markup, int32_t **ids, size_t *n, serve_error *e) {
    const size_t max_ids = s->slot_positions > 1 ? s->slot_positions - 1 : 1;
    int over = 0;
    rlx_status st;
    if (chat) {
        st = app_encode_chat(s->tok, text, markup, n_markup, s->special_in_content, max_ids, ids, n, &over);
    } else {
        rlx_encode_options eo = {.size = sizeof eo, .parse_special = 1, .max_ids = max_ids, .add_special = 1};
        st = rlx_tokenizer_encode_ex(s->tok, text, strlen(text), &eo, ids, n, &over);
    }
    if (st != RLX_OK)
        return serve_error_set(e, 400, "invalid_request_error", "invalid_value", chat ? "messages" : "prompt",
                               "cannot tokenize the prompt: %s", rlx_last_error()),
               -1;
    if (over)
        return serve_error_set(e, 400, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt",
                               "the prompt of more than %zu tokens does not fit a slot of %u positions", max_ids,
                               s->slot_positions),
               -1;
    return 0;
}

int serve_chat_prompt(const serve_server *s, const cJSON *root, int32_t **ids, size_t *n, serve_error *e) {
    char *text = NULL;
    rlx_text_span *markup = NULL;
    size_t n_markup = 0;
    const int rc = serve_render_chat(s, root, &text, &markup, &n_markup, e) < 0
                       ? -1
                       : encode_prompt(s, 1, text, markup, n_markup, ids, n, e);
    free(text);
    free(markup);
    return rc;
}

/* A choice's own detokenizer and stop matcher. */
static int choice_start(serve_job *c, serve_error *e) {
    if (rlx_detok_create(c->server->tok, RLX_DECODE_SKIP_SPECIAL, &c->detok) != RLX_OK ||
        (c->n_stops && rlx_stop_matcher_create((const char *const *)c->stops, c->n_stops, &c->stopper) != RLX_OK))
        return serve_error_set(e, 500, "server_error", NULL, "", "%s", rlx_last_error()), -1;
    return 0;
}

/* Choice i (> 0) of a parsed job j: the request's fields, pointing at what j owns (j outlives
 * it), and a reply of its own (zeroed here, started by choice_start); it uses j's lock,
 * condition and references (group), never its own. */
static serve_job *choice_new(serve_job *j, uint32_t i) {
    serve_job *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->group = j;
    c->index = i;
    c->server = j->server;
    c->ep = j->ep;
    c->stream = j->stream;
    c->include_usage = j->include_usage;
    c->logprobs = j->logprobs;
    c->ignore_eos = j->ignore_eos;
    c->top_logprobs = j->top_logprobs;
    memcpy(c->id, j->id, sizeof c->id);
    c->created = j->created;
    c->model = j->model;
    c->prompt = j->prompt;
    c->n_prompt = j->n_prompt;
    c->max_tokens = j->max_tokens;
    c->sampler = j->sampler;               /* its logit_bias is j's biases */
    c->sampler.seed = j->sampler.seed + i; /* wraps modulo 2^64, as the seed's bits do */
    c->biases = j->biases;
    memcpy(c->stops, j->stops, sizeof c->stops);
    c->n_stops = j->n_stops;
    c->grammar = j->grammar;
    c->tools = j->tools;
    c->call_format = j->call_format;
    c->tool_choice = j->tool_choice;
    c->reasoning = j->reasoning;
    c->think_open = j->think_open;
    return c;
}

/* Choices 1 .. n - 1 of a parsed job j, each sampling with seed + index, so choice i of a
 * seeded request is the same text whatever n is, and choice 0 the request's alone. */
static int make_choices(serve_job *j, serve_error *e) {
    if (!(j->choices = calloc(j->n_choices, sizeof *j->choices)))
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    j->choices[0] = j;
    if (choice_start(j, e) < 0)
        return -1;
    for (uint32_t i = 1; i < j->n_choices; i++) {
        if (!(j->choices[i] = choice_new(j, i)))
            return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
        if (choice_start(j->choices[i], e) < 0)
            return -1;
    }
    return 0;
}

int serve_job_parse(serve_server *s, serve_endpoint ep, const char *body, size_t len, serve_job **out,
                    serve_error *err) {
    *out = NULL;
    serve_job *j = calloc(1, sizeof *j);
    if (!j)
        return serve_error_set(err, 500, "server_error", NULL, "", "out of memory"), -1;
    j->group = j;
    j->n_choices = 1;
    pthread_mutex_init(&j->mu, NULL);
    rlx__cond_init_monotonic(&j->cv);
    j->refs = 1;
    j->server = s;
    j->ep = ep;
    j->created = (long long)time(NULL);
    const int chat = ep == SERVE_CHAT || ep == SERVE_ANTHROPIC || ep == SERVE_RESPONSES;
    serve_make_id(j->id, sizeof j->id,
                  ep == SERVE_ANTHROPIC   ? "msg_"
                  : ep == SERVE_RESPONSES ? "resp_"
                  : chat                  ? "chatcmpl-"
                                          : "cmpl-");
    cJSON *root = serve_parse_body(body, len, err);
    if (root && (ep == SERVE_ANTHROPIC || ep == SERVE_RESPONSES)) { /* read as the chat request it is */
        cJSON *as_chat =
            ep == SERVE_ANTHROPIC ? serve_anthropic_request(root, err) : serve_responses_request(root, err);
        cJSON_Delete(root);
        root = as_chat;
    }
    char *text = NULL, *chat_text = NULL;
    rlx_text_span *markup = NULL;
    size_t n_markup = 0;
    int rc = -1;
    if (!root)
        goto done;
    if (parse_options(j, root, err) < 0)
        goto done;
    if (chat && (serve_render_chat(s, root, &chat_text, &markup, &n_markup, err) < 0 ||
                 encode_prompt(s, 1, chat_text, markup, n_markup, &j->prompt, &j->n_prompt, err) < 0))
        goto done;
    if (serve_constraint_parse(j, root, chat_text, err) < 0)
        goto done;
    if (!chat && (completion_prompt(j, root, &text, err) < 0 || /* text, or else the ids themselves */
                  (text && encode_prompt(s, 0, text, NULL, 0, &j->prompt, &j->n_prompt, err) < 0)))
        goto done;
    if (j->n_prompt == 0) {
        serve_error_set(err, 400, "invalid_request_error", "invalid_value", chat ? "messages" : "prompt",
                        "the prompt is empty (it encodes to no tokens)");
        goto done;
    }
    if (make_choices(j, err) < 0)
        goto done;
    rc = 0;
done:
    cJSON_Delete(root);
    free(text);
    free(chat_text);
    free(markup);
    if (rc < 0) {
        job_free(j);
        return -1;
    }
    *out = j;
    return 0;
}

int serve_job_streams(const serve_job *j) { return j->stream; }

/* Whether the engine stepped since the job last looked: the requests ahead of a queued job, or
 * the chunks of its own prompt, are progress the job's events do not show. */
static int engine_progressed(serve_job *j) {
    rlx_engine_stats st;
    rlx_engine_stats_of(j->server->engine, &st);
    const int stepped = st.steps != j->steps_seen;
    j->steps_seen = st.steps;
    return stepped;
}

const rlx_sampler_params *serve_job_sampler(const serve_job *j) { return &j->sampler; }

/* Submits the choices of job j to the engine, as one prompt pass (rlx_engine_submit_choices). */
static rlx_status submit_choices(serve_server *s, serve_job *j) {
    rlx_request *req = calloc(j->n_choices, sizeof *req);
    uint64_t *ids = calloc(j->n_choices, sizeof *ids);
    if (!req || !ids) {
        free(req);
        free(ids);
        return RLX_E_NOMEM; /* serve_job_submit says so */
    }
    static const int32_t no_stop = -1; /* an id no vocabulary has */
    for (uint32_t i = 0; i < j->n_choices; i++)
        req[i] = (rlx_request){.size = sizeof req[i],
                               .prompt = j->prompt,
                               .n_prompt = (uint32_t)j->n_prompt,
                               .max_tokens = j->max_tokens,
                               .sampler = j->choices[i]->sampler,
                               .logprobs = j->logprobs,
                               .top_logprobs = j->top_logprobs,
                               .stop_ids = j->ignore_eos ? &no_stop : NULL,
                               .n_stop_ids = j->ignore_eos ? 1 : 0,
                               .on_event = on_event,
                               .ctx = j->choices[i],
                               .grammar = j->grammar,
                               .grammar_vocab = j->grammar ? s->gvocab : NULL};
    pthread_mutex_lock(&j->mu);
    /* the engine's, one per choice, given back with each DONE event (which may come before
     * submit returns) */
    j->refs += (int)j->n_choices;
    pthread_mutex_unlock(&j->mu);
    rlx_status rc = rlx_engine_submit_choices(s->engine, req, j->n_choices, ids);
    pthread_mutex_lock(&j->mu);
    if (rc != RLX_OK)
        j->refs -= (int)j->n_choices;
    for (uint32_t i = 0; i < j->n_choices && rc == RLX_OK; i++)
        j->choices[i]->engine_id = ids[i];
    pthread_mutex_unlock(&j->mu);
    free(req);
    free(ids);
    return rc;
}

int serve_job_submit(serve_server *s, serve_job *j, serve_error *err) {
    pthread_mutex_lock(&j->mu);
    clock_gettime(CLOCK_MONOTONIC, &j->last_news);
    pthread_mutex_unlock(&j->mu);
    engine_progressed(j); /* from here on, a step of the engine counts as the job's progress */
    /* the engine takes every choice or none */
    const rlx_status rc = submit_choices(s, j);
    if (rc == RLX_OK)
        return 0;
    if (rc == RLX_E_BUSY && atomic_load(&s->phase) == SERVE_DRAINING)
        serve_error_set(err, 503, "server_error", "shutting_down", "", "the server is shutting down");
    else if (rc == RLX_E_BUSY)
        serve_error_set(err, 503, "server_error", "server_busy", "",
                        "every slot is busy and the queue is full; retry later");
    else if (rc == RLX_E_RANGE)
        serve_error_set(err, 400, "invalid_request_error", "context_length_exceeded",
                        j->ep == SERVE_RESPONSES                          ? "input"
                        : j->ep == SERVE_CHAT || j->ep == SERVE_ANTHROPIC ? "messages"
                                                                          : "prompt",
                        "the prompt of %zu tokens does not fit a slot of %u positions (%s)", j->n_prompt,
                        s->slot_positions, rlx_last_error());
    else if (rc == RLX_E_INVALID)
        serve_error_set(err, 400, "invalid_request_error", "invalid_value", "", "%s", rlx_last_error());
    else if (rc == RLX_E_NOMEM)
        serve_error_set(err, 500, "server_error", NULL, "", "out of memory");
    else
        serve_error_set(err, 500, "server_error", NULL, "", "the engine refused the request: %s", rlx_last_error());
    if (rc == RLX_E_BUSY)
        err->retry_after = 1;
    return -1;
}

static double seconds_since(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) * 1e-9;
}

/* What the client's socket says without reading from it. A reset, or a write the client's
 * kernel refused with one, breaks the connection (POLLERR, POLLHUP). A FIN alone (POLLRDHUP)
 * says only that the client sent all it will: shutdown(SHUT_WR) after a request, which some
 * clients and proxies do and which still reads the answer, looks the same as a close. */
static serve_wait peer_state(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (fd < 0 || poll(&p, 1, 0) <= 0)
        return SERVE_WAIT_NEWS;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL))
        return SERVE_WAIT_HANGUP;
    return p.revents & POLLRDHUP ? SERVE_WAIT_PEER_SHUTDOWN : SERVE_WAIT_NEWS;
}

/* News for the connection: a streaming one takes every piece of every choice (and each
 * choice's end), the others only the end of all. */
static int has_news(const serve_job *j) {
    int all_done = 1;
    for (uint32_t i = 0; i < j->n_choices; i++) {
        const serve_job *c = j->choices[i];
        if (j->stream && !c->closed && (c->done || c->text.len > c->text_sent || c->n_lps > c->lps_sent))
            return 1;
        all_done &= c->done;
    }
    return all_done;
}

serve_wait serve_job_wait(serve_job *j, int fd, uint32_t timeout_s, int report_shutdown) {
    for (;;) {
        pthread_mutex_lock(&j->mu);
        if (!has_news(j)) {
            const struct timespec until = rlx__deadline_in(HANGUP_POLL_MS);
            pthread_cond_timedwait(&j->cv, &j->mu, &until);
        }
        int news = has_news(j);
        double quiet = seconds_since(&j->last_news);
        pthread_mutex_unlock(&j->mu);
        if (news)
            return SERVE_WAIT_NEWS;
        const serve_wait peer = peer_state(fd);
        if (peer == SERVE_WAIT_HANGUP || (peer == SERVE_WAIT_PEER_SHUTDOWN && report_shutdown))
            return peer;
        if (quiet > timeout_s) {
            if (!engine_progressed(j))
                return SERVE_WAIT_TIMEOUT;
            pthread_mutex_lock(&j->mu);
            clock_gettime(CLOCK_MONOTONIC, &j->last_news);
            pthread_mutex_unlock(&j->mu);
        }
    }
}

int serve_job_finished(serve_job *j) {
    pthread_mutex_lock(&j->mu);
    int finished = 1;
    for (uint32_t i = 0; i < j->n_choices; i++) {
        const serve_job *c = j->choices[i];
        finished &= c->done && c->text.len == c->text_sent && c->n_lps == c->lps_sent;
    }
    pthread_mutex_unlock(&j->mu);
    return finished;
}

void serve_job_release(serve_job *j) {
    if (!j)
        return;
    uint64_t running[RLX_ENGINE_MAX_SLOTS]; /* n_choices is at most the slots */
    uint32_t n = 0;
    pthread_mutex_lock(&j->mu);
    for (uint32_t i = 0; j->choices && i < j->n_choices; i++)
        if (!j->choices[i]->done && j->choices[i]->engine_id)
            running[n++] = j->choices[i]->engine_id;
    pthread_mutex_unlock(&j->mu);
    for (uint32_t i = 0; i < n; i++)
        rlx_engine_cancel(j->server->engine, running[i]);
    pthread_mutex_lock(&j->mu);
    unref_locked(j);
}

// ---- responses ----

/* An engine end that is no answer: an error, or a cancel by the drain of a shutdown. */
/* The stop matcher emits the text before a stop string once it completes, so the raw text
 * goes on with that string where the reply ends; the shortest such string is the one that
 * completed first. */
const char *serve_job_stop_string(const serve_job *j) {
    const char *found = NULL;
    size_t found_len = 0;
    for (size_t i = 0; j->stop_hit && i < j->n_stops; i++) {
        const size_t n = strlen(j->stops[i]);
        if (j->raw.len >= j->text.len + n && memcmp(j->raw.data + j->text.len, j->stops[i], n) == 0 &&
            (!found || n < found_len)) {
            found = j->stops[i];
            found_len = n;
        }
    }
    return found;
}

int serve_job_end_error(const serve_job *j, serve_error *e) {
    if (j->finish == RLX_FINISH_ERROR) {
        serve_error_set(e, 500, "server_error", NULL, "", "generation failed: %s (%s)", j->message,
                        rlx_status_str(j->status));
        return 1;
    }
    if (j->finish == RLX_FINISH_CANCELLED) {
        serve_error_set(e, 503, "server_error", "shutting_down", "",
                        "the request was cancelled: the server is shutting down");
        return 1;
    }
    if (j->out_of_memory) {
        serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
        return 1;
    }
    return 0;
}

/* Why the reply ended, in OpenAI's words: a reply that called tools and ended on its own says so. */
static const char *finish_reason(const serve_job *j, int calls) {
    return j->finish == RLX_FINISH_LENGTH || j->finish == RLX_FINISH_CONTEXT ? "length" : calls ? "tool_calls" : "stop";
}

/* The log-probabilities of lps[0 .. n) in the endpoint's shape. */
static cJSON *logprobs_json(const serve_job *j, const token_lp *lps, size_t n) {
    const rlx_tokenizer *tok = j->server->tok;
    cJSON *root = cJSON_CreateObject();
    if (j->ep == SERVE_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(root, "content");
        for (size_t i = 0; i < n; i++) {
            cJSON *item = cJSON_CreateObject();
            app_json_add_token_text(item, tok, lps[i].token);
            cJSON_AddNumberToObject(item, "logprob", lps[i].logprob);
            cJSON *top = cJSON_AddArrayToObject(item, "top_logprobs");
            for (uint32_t k = 0; k < lps[i].n_top; k++) {
                cJSON *alt = cJSON_CreateObject();
                app_json_add_token_text(alt, tok, lps[i].top_ids[k]);
                cJSON_AddNumberToObject(alt, "logprob", lps[i].top_logprobs[k]);
                cJSON_AddItemToArray(top, alt);
            }
            cJSON_AddItemToArray(content, item);
        }
        cJSON_AddNullToObject(root, "refusal");
        return root;
    }
    cJSON *tokens = cJSON_AddArrayToObject(root, "tokens");
    cJSON *token_logprobs = cJSON_AddArrayToObject(root, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(root, "top_logprobs");
    cJSON *offsets = cJSON_AddArrayToObject(root, "text_offset");
    for (size_t i = 0; i < n; i++) {
        cJSON *t = cJSON_CreateObject();
        app_json_add_token_text(t, tok, lps[i].token);
        cJSON *text = cJSON_DetachItemFromObjectCaseSensitive(t, "token");
        cJSON_AddItemToArray(tokens, text ? text : cJSON_CreateString(""));
        cJSON_Delete(t);
        cJSON_AddItemToArray(token_logprobs, cJSON_CreateNumber(lps[i].logprob));
        /* completions' alternatives are an object from token text to log-probability */
        cJSON *alts = cJSON_CreateObject();
        for (uint32_t k = 0; k < lps[i].n_top; k++) {
            cJSON *a = cJSON_CreateObject();
            app_json_add_token_text(a, tok, lps[i].top_ids[k]);
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(a, "token");
            cJSON_AddNumberToObject(alts, cJSON_IsString(name) ? name->valuestring : "", lps[i].top_logprobs[k]);
            cJSON_Delete(a);
        }
        cJSON_AddItemToArray(top, alts);
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)lps[i].text_offset));
    }
    return root;
}

/* OpenAI's usage of the n choices: the prompt once, the completion tokens of all. */
static cJSON *usage_json(const serve_job *j) {
    double generated = 0;
    for (uint32_t i = 0; i < j->n_choices; i++)
        generated += j->choices[i]->usage.n_generated;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->usage.n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", generated);
    cJSON_AddNumberToObject(u, "total_tokens", (double)j->usage.n_prompt + generated);
    cJSON *details = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(details, "cached_tokens", j->usage.n_cached);
    return u;
}

/* The members every response and chunk opens with. */
static cJSON *envelope(const serve_job *j, const char *object) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", j->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)j->created);
    cJSON_AddStringToObject(root, "model", j->model);
    cJSON_AddStringToObject(root, "system_fingerprint", "rlx-" RLX_APP_VERSION);
    return root;
}

static cJSON *openai_response(serve_job *j);

/* The error of the first choice that ended with one: it fails the whole request (the others
 * are cancelled when the connection lets go of the job). Under j->mu. */
static int group_end_error(const serve_job *j, serve_error *e) {
    for (uint32_t i = 0; i < j->n_choices; i++)
        if (serve_job_end_error(j->choices[i], e))
            return 1;
    return 0;
}

/* llama-server's answer to n_cmpl > 1: an array of its objects, each with its index. */
static cJSON *llama_responses(serve_job *j) {
    if (j->n_choices == 1)
        return serve_llama_response(j);
    cJSON *arr = cJSON_CreateArray();
    for (uint32_t i = 0; i < j->n_choices; i++)
        cJSON_AddItemToArray(arr, serve_llama_response(j->choices[i]));
    return arr;
}

char *serve_job_response(serve_job *j, unsigned *status) {
    serve_error e;
    pthread_mutex_lock(&j->mu);
    if (group_end_error(j, &e)) {
        pthread_mutex_unlock(&j->mu);
        *status = e.status;
        return j->ep == SERVE_ANTHROPIC ? serve_anthropic_error_json(&e) : serve_error_json(&e);
    }
    cJSON *root = j->ep == SERVE_LLAMA_COMPLETION ? llama_responses(j)
                  : j->ep == SERVE_ANTHROPIC      ? serve_anthropic_response(j)
                  : j->ep == SERVE_RESPONSES      ? serve_responses_response(j)
                                                  : openai_response(j);
    for (uint32_t i = 0; i < j->n_choices; i++) {
        serve_job *c = j->choices[i];
        c->text_sent = c->text.len;
        c->lps_sent = c->n_lps;
    }
    pthread_mutex_unlock(&j->mu);
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *status = 200;
    return body;
}

int serve_json_copy(cJSON *to, const cJSON *from, const char *name, const char *as, serve_error *e) {
    const cJSON *item = serve_member(from, name);
    if (!item)
        return 0;
    cJSON *dup = cJSON_Duplicate(item, 1);
    if (!dup || !cJSON_AddItemToObject(to, as, dup)) {
        cJSON_Delete(dup);
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    }
    return 0;
}

int serve_json_append(cJSON *o, const char *name, const char *more, size_t len) {
    const cJSON *had = cJSON_GetObjectItemCaseSensitive(o, name);
    const size_t have = cJSON_IsString(had) ? strlen(had->valuestring) : 0;
    char *joined = malloc(have + len + 1);
    if (!joined)
        return -1;
    memcpy(joined, have ? had->valuestring : "", have);
    memcpy(joined + have, more, len);
    joined[have + len] = 0;
    cJSON *value = cJSON_CreateString(joined);
    free(joined);
    if (!value)
        return -1;
    if (had)
        return cJSON_ReplaceItemInObjectCaseSensitive(o, name, value) ? 0 : (cJSON_Delete(value), -1);
    return cJSON_AddItemToObject(o, name, value) ? 0 : (cJSON_Delete(value), -1);
}

/* A whole reply's content and tool calls (OpenAI's message.tool_calls), from serve_calls_scan. */
typedef struct whole_reply {
    serve_buf reasoning, content;
    cJSON *calls;
} whole_reply;

static void whole_reasoning(void *ctx, const char *text, size_t len) {
    serve_buf_append(&((whole_reply *)ctx)->reasoning, text, len);
}

static void whole_content(void *ctx, const char *text, size_t len) {
    serve_buf_append(&((whole_reply *)ctx)->content, text, len);
}

/* One tool call's object, or the arguments it gains; its arguments string grows as they come. */
static void whole_call(void *ctx, int index, const char *id, const char *name, const char *args, size_t len) {
    whole_reply *w = ctx;
    (void)index;
    if (!args) {
        cJSON_DeleteItemFromArray(w->calls, cJSON_GetArraySize(w->calls) - 1);
        return;
    }
    cJSON *call = id ? cJSON_CreateObject() : cJSON_GetArrayItem(w->calls, cJSON_GetArraySize(w->calls) - 1);
    if (!call)
        return;
    cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    if (id) {
        cJSON_AddItemToArray(w->calls, call);
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
        fn = cJSON_AddObjectToObject(call, "function");
        cJSON_AddStringToObject(fn, "name", name);
        cJSON_AddStringToObject(fn, "arguments", "");
    }
    serve_json_append(fn, "arguments", args, len);
}

/* One choice of the chat.completion or text_completion object; under the group's mu. */
static cJSON *choice_json(serve_job *j) {
    const int chat = j->ep == SERVE_CHAT;
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", j->index);
    const char *text = j->text.len ? j->text.data : "";
    char *copy = strndup(text, j->text.len);
    int n_calls = 0;
    if (serve_reply_scanned(j)) {
        /* the reply split into its reasoning, its content and its tool calls */
        whole_reply w = {.calls = cJSON_CreateArray()};
        serve_calls scan = j->calls;
        j->calls = (serve_calls){0};
        serve_calls_scan(j, 1, &(serve_call_sink){whole_reasoning, whole_content, whole_call, &w});
        j->calls = scan;
        cJSON *msg = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        char *reasoning = w.reasoning.len ? strndup(w.reasoning.data, w.reasoning.len) : NULL;
        if (reasoning)
            cJSON_AddStringToObject(msg, "reasoning_content", reasoning);
        free(reasoning);
        serve_buf_free(&w.reasoning);
        char *content = w.content.len ? strndup(w.content.data, w.content.len) : NULL;
        n_calls = cJSON_GetArraySize(w.calls);
        if (content || !n_calls)
            cJSON_AddStringToObject(msg, "content", content ? content : "");
        else
            cJSON_AddNullToObject(msg, "content");
        free(content);
        if (n_calls)
            cJSON_AddItemToObject(msg, "tool_calls", w.calls);
        else
            cJSON_Delete(w.calls);
        cJSON_AddNullToObject(msg, "refusal");
        serve_buf_free(&w.content);
    } else if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", copy ? copy : "");
        cJSON_AddNullToObject(msg, "refusal");
    } else {
        cJSON_AddStringToObject(choice, "text", copy ? copy : "");
    }
    free(copy);
    if (j->logprobs)
        cJSON_AddItemToObject(choice, "logprobs", logprobs_json(j, j->lps, j->n_lps));
    else
        cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddStringToObject(choice, "finish_reason", finish_reason(j, n_calls));
    return choice;
}

/* The chat.completion or text_completion object of a finished job; under j->mu. */
static cJSON *openai_response(serve_job *j) {
    cJSON *root = envelope(j, j->ep == SERVE_CHAT ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (uint32_t i = 0; i < j->n_choices; i++)
        cJSON_AddItemToArray(choices, choice_json(j->choices[i]));
    cJSON_AddItemToObject(root, "usage", usage_json(j));
    return root;
}

void serve_add_error_event(serve_buf *out, const char *event, char *json) {
    if (event) {
        serve_buf_append(out, "event: ", 7);
        serve_buf_append(out, event, strlen(event));
        serve_buf_append(out, "\n", 1);
    }
    serve_buf_append(out, "data: ", 6);
    serve_buf_append(out, json ? json : "{}", json ? strlen(json) : 2);
    serve_buf_append(out, "\n\n", 2);
    free(json);
}

void serve_add_event(serve_buf *out, const char *event, cJSON *root) {
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) {
        out->failed = 1;
        return;
    }
    if (event) {
        serve_buf_append(out, "event: ", 7);
        serve_buf_append(out, event, strlen(event));
        serve_buf_append(out, "\n", 1);
    }
    serve_buf_append(out, "data: ", 6);
    serve_buf_append(out, json, strlen(json));
    serve_buf_append(out, "\n\n", 2);
    free(json);
}

/* A chunk of the stream: text (NULL for none) and the log-probabilities of lps[0 .. n_lps), with
 * finish (NULL while the reply goes on). The first chat chunk carries the role. */
static cJSON *chunk(serve_job *j, const char *text, size_t len, const token_lp *lps, size_t n_lps, const char *finish) {
    const int chat = j->ep == SERVE_CHAT;
    cJSON *root = envelope(j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", j->index);
    char *copy = strndup(text ? text : "", text ? len : 0);
    if (chat) {
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (!j->opened)
            cJSON_AddStringToObject(delta, "role", "assistant");
        if (text || !j->opened)
            cJSON_AddStringToObject(delta, "content", copy ? copy : "");
    } else {
        cJSON_AddStringToObject(choice, "text", copy ? copy : "");
    }
    free(copy);
    j->opened = 1;
    if (j->logprobs && n_lps)
        cJSON_AddItemToObject(choice, "logprobs", logprobs_json(j, lps, n_lps));
    else
        cJSON_AddNullToObject(choice, "logprobs");
    if (finish)
        cJSON_AddStringToObject(choice, "finish_reason", finish);
    else
        cJSON_AddNullToObject(choice, "finish_reason");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    if (j->include_usage) /* OpenAI: with include_usage every chunk but the last has usage null */
        cJSON_AddNullToObject(root, "usage");
    return root;
}

typedef struct stream_reply {
    serve_job *j;
    serve_buf *out;
} stream_reply;

/* A chat chunk without content, and its delta for the caller to fill. */
static cJSON *delta_chunk(serve_job *j, cJSON **delta) {
    cJSON *root = chunk(j, NULL, 0, NULL, 0, NULL);
    *delta = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0),
                                              "delta");
    return root;
}

/* delta.reasoning_content, as llama-server streams a thinking model's block */
static void stream_reasoning(void *ctx, const char *text, size_t len) {
    stream_reply *r = ctx;
    cJSON *delta, *root = delta_chunk(r->j, &delta);
    char *copy = strndup(text, len);
    cJSON_AddStringToObject(delta, "reasoning_content", copy ? copy : "");
    free(copy);
    serve_add_event(r->out, NULL, root);
}

static void stream_content(void *ctx, const char *text, size_t len) {
    stream_reply *r = ctx;
    serve_add_event(r->out, NULL, chunk(r->j, text, len, NULL, 0, NULL));
}

/* A delta of delta.tool_calls: the call's index always, its id, type and name when it opens. */
static void stream_call(void *ctx, int index, const char *id, const char *name, const char *args, size_t len) {
    stream_reply *r = ctx;
    if (!args) /* a call cut short: what went out stays, and the finish reason says length */
        return;
    cJSON *delta, *root = delta_chunk(r->j, &delta);
    cJSON *call = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(delta, "tool_calls"), call);
    cJSON_AddNumberToObject(call, "index", index);
    if (id) {
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
    }
    cJSON *fn = cJSON_AddObjectToObject(call, "function");
    if (name)
        cJSON_AddStringToObject(fn, "name", name);
    char *text = strndup(args, len);
    cJSON_AddStringToObject(fn, "arguments", text ? text : "");
    free(text);
    serve_add_event(r->out, NULL, root);
}

/* The chunks of choice j since the last call: its opening, its text and log-probabilities,
 * and once it is done its finish (or the error, which makes *failed 1). Under the group's mu. */
static void stream_choice(serve_job *j, serve_buf *out, int *failed) {
    if (!j->opened && j->ep == SERVE_CHAT)
        serve_add_event(out, NULL, chunk(j, NULL, 0, NULL, 0, NULL));
    size_t new_text = j->text.len - j->text_sent, new_lps = j->n_lps - j->lps_sent;
    const int complete = j->done;
    if (serve_reply_scanned(j)) {
        /* reasoning, content and tool calls as the scan finds them; the log-probabilities on their own */
        stream_reply r = {.j = j, .out = out};
        serve_calls_scan(j, complete, &(serve_call_sink){stream_reasoning, stream_content, stream_call, &r});
        if (new_lps)
            serve_add_event(out, NULL, chunk(j, NULL, 0, j->lps + j->lps_sent, new_lps, NULL));
    } else if (new_text || new_lps) {
        serve_add_event(out, NULL,
                        chunk(j, j->text.data + j->text_sent, new_text, j->lps + j->lps_sent, new_lps, NULL));
    }
    j->text_sent = j->text.len;
    j->lps_sent = j->n_lps;
    serve_error e;
    if (complete && serve_job_end_error(j, &e)) {
        /* the status line went out with the first byte: the error travels as an event */
        serve_add_error_event(out, NULL, serve_error_json(&e));
        *failed = 1;
    } else if (complete) {
        serve_add_event(out, NULL,
                        chunk(j, j->ep == SERVE_CHAT ? NULL : "", 0, NULL, 0, finish_reason(j, j->calls.index)));
    }
    j->closed = complete;
}

/* llama-server's events of choice j since the last call (its own index in each). */
static void stream_llama_choice(serve_job *j, serve_buf *out, int *failed) {
    serve_error e;
    j->closed = serve_llama_stream(j, out);
    *failed |= j->closed && serve_job_end_error(j, &e);
}

int serve_job_stream(serve_job *j, serve_buf *out) {
    pthread_mutex_lock(&j->mu);
    if (j->ep == SERVE_ANTHROPIC || j->ep == SERVE_RESPONSES) { /* one choice, events of their own */
        const int complete = j->ep == SERVE_ANTHROPIC ? serve_anthropic_stream(j, out) : serve_responses_stream(j, out);
        pthread_mutex_unlock(&j->mu);
        return complete;
    }
    /* each choice's chunks carry its index; one that fails ends the stream (the connection's
     * release cancels the others) */
    int complete = 1, failed = 0;
    for (uint32_t i = 0; i < j->n_choices && !failed; i++) {
        serve_job *c = j->choices[i];
        if (!c->closed && j->ep == SERVE_LLAMA_COMPLETION)
            stream_llama_choice(c, out, &failed);
        else if (!c->closed)
            stream_choice(c, out, &failed);
        complete &= c->closed;
    }
    complete |= failed;
    if (complete && !failed && j->include_usage && j->ep != SERVE_LLAMA_COMPLETION) {
        cJSON *root = envelope(j, j->ep == SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(root, "choices");
        cJSON_AddItemToObject(root, "usage", usage_json(j));
        serve_add_event(out, NULL, root);
    }
    /* llama-server's /completion stream has no [DONE] */
    if (complete && j->ep != SERVE_LLAMA_COMPLETION)
        serve_buf_append(out, "data: [DONE]\n\n", 14);
    pthread_mutex_unlock(&j->mu);
    return complete;
}
