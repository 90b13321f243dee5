/* llama-server's own POST /completion (job.h): its response object and its stream of events, over
 * the jobs openai.c runs (n_predict and n_probs are read with the OpenAI fields there). */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "job.h"
#include "output.h"

/* llama-server's stop_type: why the generation ended. */
static const char *llama_stop_type(const serve_job *j) {
    return j->stop_hit                       ? "word"
           : j->finish == RLX_FINISH_EOS     ? "eos"
           : j->finish == RLX_FINISH_LENGTH  ? "limit"
           : j->finish == RLX_FINISH_CONTEXT ? "limit"
                                             : "none";
}

/* llama-server's completion_probabilities of lps[0 .. n): each token and its alternatives. */
static cJSON *llama_probabilities(const serve_job *j, const token_lp *lps, size_t n) {
    const rlx_tokenizer *tok = j->server->tok;
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON *item = cJSON_CreateObject();
        cJSON_AddNumberToObject(item, "id", lps[i].token);
        app_json_add_token_text(item, tok, lps[i].token);
        cJSON_AddNumberToObject(item, "logprob", lps[i].logprob);
        cJSON *top = cJSON_AddArrayToObject(item, "top_logprobs");
        for (uint32_t k = 0; k < lps[i].n_top; k++) {
            cJSON *alt = cJSON_CreateObject();
            cJSON_AddNumberToObject(alt, "id", lps[i].top_ids[k]);
            app_json_add_token_text(alt, tok, lps[i].top_ids[k]);
            cJSON_AddNumberToObject(alt, "logprob", lps[i].top_logprobs[k]);
            cJSON_AddItemToArray(top, alt);
        }
        cJSON_AddItemToArray(arr, item);
    }
    return arr;
}

/* One /completion object: text[0, len) so far (the whole reply when final), with the fields
 * llama-server gives every chunk, and when final those of its last one. Under j->mu. */
static cJSON *llama_object(serve_job *j, const char *text, size_t len, const token_lp *lps, size_t n_lps, int final) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "index", j->index); /* the choice's, of n_cmpl */
    char *copy = strndup(text ? text : "", text ? len : 0);
    cJSON_AddStringToObject(root, "content", copy ? copy : "");
    free(copy);
    cJSON_AddArrayToObject(root, "tokens");
    cJSON_AddNumberToObject(root, "id_slot", -1);
    cJSON_AddBoolToObject(root, "stop", final);
    cJSON_AddStringToObject(root, "model", j->model);
    if (j->logprobs && n_lps)
        cJSON_AddItemToObject(root, "completion_probabilities", llama_probabilities(j, lps, n_lps));
    if (final) { /* the counts are the engine's, known once it is done */
        cJSON_AddNumberToObject(root, "tokens_predicted", j->usage.n_generated);
        cJSON_AddNumberToObject(root, "tokens_evaluated", j->usage.n_prompt);
        cJSON_AddStringToObject(root, "stop_type", llama_stop_type(j));
        const char *word = serve_job_stop_string(j);
        cJSON_AddStringToObject(root, "stopping_word", word ? word : "");
        cJSON_AddBoolToObject(root, "truncated", 0);
        cJSON_AddBoolToObject(root, "has_new_line", j->text.len && memchr(j->text.data, '\n', j->text.len));
        cJSON_AddNumberToObject(root, "tokens_cached", j->usage.n_cached);
        /* llama-server's: the request's sampling parameters, as its /slots shows them */
        serve_params_json(cJSON_AddObjectToObject(root, "generation_settings"), &j->sampler, j->max_tokens,
                          j->logprobs ? j->top_logprobs : 0, j->grammar != NULL);
        cJSON *timings = cJSON_AddObjectToObject(root, "timings");
        /* llama-server's: the prompt tokens computed, and those taken from the cache */
        cJSON_AddNumberToObject(timings, "cache_n", j->usage.n_cached);
        cJSON_AddNumberToObject(timings, "prompt_n", j->usage.n_prompt - j->usage.n_cached);
        cJSON_AddNumberToObject(timings, "predicted_n", j->usage.n_generated);
    }
    return root;
}

cJSON *serve_llama_response(serve_job *j) { return llama_object(j, j->text.data, j->text.len, j->lps, j->n_lps, 1); }

/* llama-server's stream: an event per piece of text, then the final object; no [DONE]. */
int serve_llama_stream(serve_job *j, serve_buf *out) {
    size_t new_text = j->text.len - j->text_sent, new_lps = j->n_lps - j->lps_sent;
    if (new_text || new_lps)
        serve_add_event(out, NULL,
                        llama_object(j, j->text.data + j->text_sent, new_text, j->lps + j->lps_sent, new_lps, 0));
    j->text_sent = j->text.len;
    j->lps_sent = j->n_lps;
    serve_error e;
    if (j->done && serve_job_end_error(j, &e)) {
        serve_add_error_event(out, NULL, serve_error_json(&e));
    } else if (j->done) {
        serve_add_event(out, NULL, llama_object(j, "", 0, NULL, 0, 1));
    }
    return j->done;
}
