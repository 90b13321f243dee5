/* libFuzzer target: request bodies of rlx serve through its real parsing and validation
 * (apps/rlx/serve/, linked as rlx serve links it), with a real tokenizer and chat template (the
 * model folder in RLX_FUZZ_TOKENIZER, loaded once) and a server of 1024 positions a slot.
 * Input: a body, given to every endpoint that reads one: /v1/chat/completions, /v1/completions,
 * llama-server's /completion, Anthropic's /v1/messages and its count_tokens, OpenAI's
 * /v1/responses, /tokenize, /detokenize and /apply-template. A refused body must give an error
 * in OpenAI's shape that is valid JSON, with status 400 (or 500 when out of memory); an accepted
 * generation request must give sampling parameters the core sampler takes, with a window no
 * wider than a slot, and a sampler that draws a token of the vocabulary from them (the greedy one
 * when the parameters are greedy); an accepted utility request must answer a JSON object with its
 * field (/tokenize's ids within the vocabulary). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { SLOT_POSITIONS = 1024 };

static serve_server server;
static float *logits; /* [vocab] a fixed row, its argmax at token 7 */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("RLX_FUZZ_TOKENIZER");
    rlx_tokenizer *tok = NULL;
    if (!dir || rlx_tokenizer_open(dir, &tok) != RLX_OK) {
        fprintf(stderr, "fuzz_serve: set RLX_FUZZ_TOKENIZER to a model folder with a tokenizer: %s\n",
                dir ? rlx_last_error() : "not set");
        exit(2);
    }
    server.tok = tok;
    server.vocab = rlx_tokenizer_vocab_size(tok);
    server.model_id = "fuzz";
    server.slot_positions = SLOT_POSITIONS;
    server.completion_default = 16;
    server.sampling = rlx_sampler_params_default(); /* rlx serve's without sampling flags */
    server.max_body = 1 << 20;
    server.timeout_s = 1;
    atomic_store(&server.phase, SERVE_READY);
    pthread_mutex_init(&server.latency_mu, NULL);
    if (!(logits = malloc((size_t)server.vocab * sizeof *logits)))
        exit(2);
    for (int64_t i = 0; i < server.vocab; i++)
        logits[i] = (float)((i * 2654435761u) % 1000) / 100.0f - 5.0f;
    logits[7] = 20.0f;
    return 0;
}

/* A refusal: 400 for the client's mistakes, 500 only when memory ran out; its body is JSON. */
static void check_error(const serve_error *e) {
    if (e->status != 400 && e->status != 500) {
        fprintf(stderr, "refused with status %u: %s\n", e->status, e->message);
        abort();
    }
    char *json = serve_error_json(e);
    if (!json)
        return;
    cJSON *back = cJSON_Parse(json);
    if (!back ||
        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(back, "error"), "message"))) {
        fprintf(stderr, "the error body is not OpenAI's error object: %s\n", json);
        abort();
    }
    cJSON_Delete(back);
    free(json);
}

/* What the engine would do with an accepted job's parameters: create its sampler and draw. */
static void check_sampler(const rlx_sampler_params *p) {
    if (p->repeat_last_n > SLOT_POSITIONS) {
        fprintf(stderr, "a repeat_last_n of %d, over the slot's %d positions\n", p->repeat_last_n, SLOT_POSITIONS);
        abort();
    }
    rlx_sampler *s = NULL;
    const rlx_status rc = rlx_sampler_create(p, server.vocab, &s);
    if (rc == RLX_E_NOMEM)
        return;
    if (rc != RLX_OK) {
        fprintf(stderr, "the server accepted parameters the sampler refuses: %s\n", rlx_last_error());
        abort();
    }
    const int32_t prompt[] = {1, 7, 7, 2};
    int accepted = 1;
    for (size_t i = 0; i < sizeof prompt / sizeof prompt[0] && accepted; i++)
        accepted = rlx_sampler_accept(s, prompt[i]) == RLX_OK;
    if (accepted) {
        const int32_t id = rlx_sampler_sample(s, logits);
        if (id < 0 || id >= server.vocab) {
            fprintf(stderr, "the sampler drew %d, outside the vocabulary of %lld\n", id, (long long)server.vocab);
            abort();
        }
        /* without penalties or biases the greedy choice is the row's argmax */
        const int plain =
            p->n_logit_bias == 0 && p->repeat_penalty == 1 && p->presence_penalty == 0 && p->frequency_penalty == 0;
        if (rlx_sampler_is_greedy(s) && plain && id != 7) {
            fprintf(stderr, "greedy drew %d, not the argmax 7\n", id);
            abort();
        }
    }
    rlx_sampler_destroy(s);
}

/* An utility endpoint's answer: a JSON object holding key (/tokenize: ids of the vocabulary). */
static void check_native(serve_native ep, char *json) {
    static const char *const keys[] = {"tokens", "content", "prompt"};
    cJSON *back = cJSON_Parse(json);
    const cJSON *field = cJSON_GetObjectItemCaseSensitive(back, keys[ep]);
    if (!field || (ep == SERVE_TOKENIZE ? !cJSON_IsArray(field) : !cJSON_IsString(field))) {
        fprintf(stderr, "the answer has no '%s' of the right type: %s\n", keys[ep], json);
        abort();
    }
    for (const cJSON *t = ep == SERVE_TOKENIZE ? field->child : NULL; t; t = t->next) {
        const cJSON *id = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "id") : t;
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (double)server.vocab) {
            fprintf(stderr, "/tokenize answered a token outside the vocabulary: %s\n", json);
            abort();
        }
    }
    cJSON_Delete(back);
    free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    serve_error counted = {0};
    char *count = serve_anthropic_count_tokens(&server, (const char *)data, size, &counted);
    if (count) {
        cJSON *back = cJSON_Parse(count);
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(back, "input_tokens"))) {
            fprintf(stderr, "count_tokens answered no input_tokens: %s\n", count);
            abort();
        }
        cJSON_Delete(back);
        free(count);
    } else {
        check_error(&counted);
    }
    static const serve_native natives[] = {SERVE_TOKENIZE, SERVE_DETOKENIZE, SERVE_APPLY_TEMPLATE};
    for (size_t k = 0; k < sizeof natives / sizeof natives[0]; k++) {
        serve_error e = {0};
        char *json = serve_native_answer(&server, natives[k], (const char *)data, size, &e);
        if (json)
            check_native(natives[k], json);
        else
            check_error(&e);
    }
    static const serve_endpoint endpoints[] = {SERVE_CHAT, SERVE_COMPLETION, SERVE_LLAMA_COMPLETION, SERVE_ANTHROPIC,
                                               SERVE_RESPONSES};
    for (size_t k = 0; k < sizeof endpoints / sizeof endpoints[0]; k++) {
        serve_job *job = NULL;
        serve_error e = {0};
        if (serve_job_parse(&server, endpoints[k], (const char *)data, size, &job, &e) < 0) {
            check_error(&e);
            continue;
        }
        check_sampler(serve_job_sampler(job));
        serve_job_release(job);
    }
    return 0;
}
