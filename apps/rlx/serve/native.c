/* llama-server's own utility endpoints (serve.h), for the clients and tools written against it:
 *
 *   POST /tokenize        {"content", "add_special" (false), "parse_special" (true), "with_pieces"
 *                         (false)} -> {"tokens": [id, ...]} or, with pieces, [{"id", "piece"}, ...]
 *   POST /detokenize      {"tokens": [id, ...]} -> {"content"}: special tokens written out, as
 *                         llama-server writes them
 *   POST /apply-template  a chat request's messages (and tools, chat_template_kwargs) ->
 *                         {"prompt"}: the text /v1/chat/completions would run
 *   GET /props            the slots, their context, the model and its chat template
 *   GET /slots            each slot: its request's id, sampling parameters and progress
 *
 * None of them runs the engine; every size is the body's, which --max-body bounds. A piece is
 * the token's text as rlx_tokenizer_decode gives it (a byte-level token holding part of a UTF-8
 * character shows U+FFFD, where llama-server gives the bytes as an array of numbers). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

static char *print_and_free(cJSON *root, serve_error *e) {
    char *json = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json)
        serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
    return json;
}

static char *tokenize(const serve_server *s, const cJSON *root, serve_error *e) {
    const char *content = NULL;
    int add_special = 0, parse_special = 1, with_pieces = 0;
    int rc = serve_get_string(root, "content", &content, e);
    if (rc == 0)
        serve_bad(e, "content", "'%s' is required: %s", "the text to tokenize");
    if (rc <= 0 || serve_get_bool(root, "add_special", &add_special, e) < 0 ||
        serve_get_bool(root, "parse_special", &parse_special, e) < 0 ||
        serve_get_bool(root, "with_pieces", &with_pieces, e) < 0)
        return NULL;
    rlx_encode_options eo = {.size = sizeof eo, .parse_special = parse_special, .add_special = add_special};
    int32_t *ids = NULL;
    size_t n = 0;
    if (rlx_tokenizer_encode_ex(s->tok, content, strlen(content), &eo, &ids, &n, NULL) != RLX_OK) {
        serve_error_set(e, 400, "invalid_request_error", "invalid_value", "content", "cannot tokenize 'content': %s",
                        rlx_last_error());
        return NULL;
    }
    cJSON *out = cJSON_CreateObject(), *tokens = cJSON_AddArrayToObject(out, "tokens");
    int failed = !tokens;
    for (size_t i = 0; i < n && !failed; i++) {
        cJSON *item = NULL;
        if (with_pieces) {
            char *piece = NULL;
            size_t len;
            if (rlx_tokenizer_decode(s->tok, &ids[i], 1, 0, &piece, &len) == RLX_OK &&
                (item = cJSON_CreateObject()) != NULL) {
                cJSON_AddNumberToObject(item, "id", ids[i]);
                cJSON_AddStringToObject(item, "piece", piece);
            }
            free(piece);
        } else {
            item = cJSON_CreateNumber(ids[i]);
        }
        failed = !item || !cJSON_AddItemToArray(tokens, item);
        if (failed)
            cJSON_Delete(item);
    }
    free(ids);
    if (failed) {
        cJSON_Delete(out);
        out = NULL;
    }
    return print_and_free(out, e);
}

static char *detokenize(const serve_server *s, const cJSON *root, serve_error *e) {
    const cJSON *tokens = serve_member(root, "tokens");
    if (!cJSON_IsArray(tokens))
        return serve_bad(e, "tokens", "'%s' must be %s", "an array of token ids"), NULL;
    const int n = cJSON_GetArraySize(tokens);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids)
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), NULL;
    int i = 0;
    for (const cJSON *t = tokens->child; t; t = t->next, i++) {
        const double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!(v >= 0 && v < (double)s->vocab) || v != floor(v)) { /* NaN fails the first test */
            serve_error_set(e, 400, "invalid_request_error", "invalid_value", "tokens",
                            "'tokens'[%d] is not a token id: ids are integers from 0 to %lld", i,
                            (long long)s->vocab - 1);
            free(ids);
            return NULL;
        }
        ids[i] = (int32_t)v;
    }
    char *text = NULL;
    size_t len;
    const rlx_status st = rlx_tokenizer_decode(s->tok, ids, (size_t)n, 0, &text, &len);
    free(ids);
    if (st != RLX_OK)
        return serve_error_set(e, 500, "server_error", NULL, "", "%s", rlx_last_error()), NULL;
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "content", text);
    free(text);
    return print_and_free(out, e);
}

static char *apply_template(const serve_server *s, const cJSON *root, serve_error *e) {
    char *prompt = NULL;
    rlx_text_span *markup = NULL;
    size_t n_markup = 0;
    if (serve_render_chat(s, root, &prompt, &markup, &n_markup, e) < 0)
        return NULL;
    free(markup);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", prompt);
    free(prompt);
    return print_and_free(out, e);
}

char *serve_native_answer(const serve_server *s, serve_native ep, const char *body, size_t len, serve_error *e) {
    cJSON *root = serve_parse_body(body, len, e);
    if (!root)
        return NULL;
    char *json = ep == SERVE_TOKENIZE     ? tokenize(s, root, e)
                 : ep == SERVE_DETOKENIZE ? detokenize(s, root, e)
                                          : apply_template(s, root, e);
    cJSON_Delete(root);
    return json;
}

/* The text of special token id, or "" when the model has none. */
static const char *special_text(const rlx_tokenizer *tok, int32_t id) {
    const char *t = id >= 0 ? rlx_tokenizer_token_text(tok, id) : NULL;
    return t ? t : "";
}

char *serve_props_json(const serve_server *s) {
    cJSON *root = cJSON_CreateObject();
    cJSON *gen = cJSON_AddObjectToObject(root, "default_generation_settings");
    cJSON_AddNumberToObject(gen, "n_ctx", s->slot_positions);
    cJSON_AddStringToObject(gen, "model", s->model_id);
    /* what a /completion that gives none of them gets (--n-predict, --temp, --seed, ...) */
    cJSON *params = cJSON_AddObjectToObject(gen, "params");
    serve_params_json(params, &s->sampling, s->completion_default, 0, 0);
    if (params && !s->has_seed) /* a fresh seed per request */
        cJSON_ReplaceItemInObjectCaseSensitive(params, "seed", cJSON_CreateNumber(-1));
    cJSON_AddNumberToObject(root, "total_slots", s->n_slots);
    cJSON_AddStringToObject(root, "model_alias", s->model_id);
    cJSON_AddStringToObject(root, "model_path", s->model_path ? s->model_path : "");
    const char *tmpl = s->chat_template ? s->chat_template : rlx_chat_template_text(s->tok);
    cJSON_AddStringToObject(root, "chat_template", tmpl ? tmpl : "");
    cJSON_AddStringToObject(root, "bos_token", special_text(s->tok, rlx_tokenizer_bos_id(s->tok)));
    cJSON_AddStringToObject(root, "eos_token", special_text(s->tok, rlx_tokenizer_eos_id(s->tok)));
    cJSON_AddStringToObject(root, "build_info", s->build_info ? s->build_info : "");
    cJSON *modalities = cJSON_AddObjectToObject(root, "modalities");
    cJSON_AddFalseToObject(modalities, "vision");
    cJSON_AddFalseToObject(modalities, "audio");
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return json;
}

void serve_params_json(cJSON *p, const rlx_sampler_params *sp, uint32_t max_tokens, uint32_t n_probs, int grammar) {
    if (!p)
        return;
    /* llama-server's -1 is "no limit", as rlx's 0 */
    cJSON_AddNumberToObject(p, "n_predict", max_tokens ? (double)max_tokens : -1);
    char seed[24]; /* all 64 bits: a double would round them */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)sp->seed);
    cJSON_AddRawToObject(p, "seed", seed);
    cJSON_AddNumberToObject(p, "temperature", sp->greedy ? 0 : sp->temperature);
    cJSON_AddNumberToObject(p, "top_k", sp->top_k);
    cJSON_AddNumberToObject(p, "top_p", sp->top_p);
    cJSON_AddNumberToObject(p, "min_p", sp->min_p);
    cJSON_AddNumberToObject(p, "repeat_last_n", sp->repeat_last_n);
    cJSON_AddNumberToObject(p, "repeat_penalty", sp->repeat_penalty);
    cJSON_AddNumberToObject(p, "presence_penalty", sp->presence_penalty);
    cJSON_AddNumberToObject(p, "frequency_penalty", sp->frequency_penalty);
    cJSON_AddNumberToObject(p, "n_probs", n_probs);
    cJSON_AddNumberToObject(p, "n_logit_bias", sp->n_logit_bias);
    cJSON_AddBoolToObject(p, "grammar", grammar);
}

/* One slot in llama-server's shape. Its request's parameters and next_token only while one runs:
 * an idle slot keeps no request's (llama-server shows its last task's). llama-server's fields
 * that the engine has no value for (has_new_line, the texts, dry_*, mirostat) are left out. */
static cJSON *slot_json(uint32_t id, const rlx_engine_slot_info *in) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    /* llama-server's task ids are ints; rlx's request ids count from 1 (-1: none ran yet) */
    cJSON_AddNumberToObject(o, "id_task", in->request_id ? (double)in->request_id : -1);
    cJSON_AddNumberToObject(o, "n_ctx", in->n_positions);
    cJSON_AddBoolToObject(o, "is_processing", in->busy);
    cJSON_AddNumberToObject(o, "n_kv_held", in->n_held); /* rlx's: KV rows kept, for a later prefix */
    if (!in->busy)
        return o;
    cJSON_AddNumberToObject(o, "n_prompt_tokens", in->n_prompt);
    cJSON_AddNumberToObject(o, "n_prompt_tokens_cache", in->n_cached);
    serve_params_json(cJSON_AddObjectToObject(o, "params"), &in->sampler, in->max_tokens, in->top_logprobs,
                      in->has_grammar);
    cJSON *next = cJSON_AddObjectToObject(o, "next_token");
    cJSON_AddBoolToObject(next, "has_next_token", 1);
    cJSON_AddNumberToObject(next, "n_remain", in->max_tokens ? (double)in->max_tokens - in->n_generated : -1);
    cJSON_AddNumberToObject(next, "n_decoded", in->n_generated);
    return o;
}

char *serve_slots_json(const serve_server *s, uint32_t *n_idle, serve_error *e) {
    cJSON *arr = cJSON_CreateArray();
    *n_idle = 0;
    for (uint32_t i = 0; arr && i < s->n_slots; i++) {
        rlx_engine_slot_info in = {.size = sizeof in};
        if (rlx_engine_slot_info_of(s->engine, i, &in) != RLX_OK) {
            cJSON_Delete(arr);
            serve_error_set(e, 500, "server_error", NULL, "", "slot %u: %s", i, rlx_last_error());
            return NULL;
        }
        *n_idle += !in.busy;
        cJSON_AddItemToArray(arr, slot_json(i, &in));
    }
    char *json = arr ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    if (!json)
        serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
    return json;
}
