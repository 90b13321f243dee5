/* The output of generate: streamed text, ids, or one JSON object (cJSON). */
#include "output.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common.h"

/* One generated token's log-probabilities, kept for the JSON object. */
typedef struct token_logprobs {
    float logprob;
    uint32_t n_top;
    int32_t top_ids[APP_MAX_LOGPROBS];
    float top_logprobs[APP_MAX_LOGPROBS];
} token_logprobs;

struct app_output {
    app_output_options opts;
    rlx_detok *detok;          /* with a tokenizer */
    rlx_stop_matcher *stopper; /* with stop strings */
    int stopped, failed, n_printed;
    char *text; /* json: the text so far */
    size_t len, cap;
    int32_t *ids; /* json: the generated ids */
    token_logprobs *lp;
    size_t n_ids, cap_ids;
};

int app_output_create(const app_output_options *opts, app_output **out) {
    app_output *o = calloc(1, sizeof *o);
    if (!o)
        return app_fail("generate: out of memory");
    o->opts = *opts;
    if (opts->tok && rlx_detok_create(opts->tok, RLX_DECODE_SKIP_SPECIAL, &o->detok) != RLX_OK) {
        app_output_destroy(o);
        return app_fail_rlx("generate");
    }
    if (opts->n_stops && rlx_stop_matcher_create(opts->stops, opts->n_stops, &o->stopper) != RLX_OK) {
        app_output_destroy(o);
        return app_fail_rlx("generate: --stop");
    }
    *out = o;
    return 0;
}

void app_output_destroy(app_output *o) {
    if (!o)
        return;
    rlx_detok_destroy(o->detok);
    rlx_stop_matcher_destroy(o->stopper);
    free(o->text);
    free(o->ids);
    free(o->lp);
    free(o);
}

int app_output_stopped(const app_output *o) { return o->stopped; }

/* Text that survived the stop strings: printed now, or kept for the JSON object. */
static void put_text(app_output *o, const char *text, size_t len) {
    if (!len || o->failed)
        return;
    if (!o->opts.json) {
        if (fwrite(text, 1, len, o->opts.out) != len || fflush(o->opts.out) != 0)
            o->failed = 1;
        return;
    }
    if (o->len + len + 1 > o->cap) {
        size_t cap = (o->len + len + 1) * 2;
        char *grown = realloc(o->text, cap);
        if (!grown) {
            o->failed = 1;
            return;
        }
        o->text = grown;
        o->cap = cap;
    }
    memcpy(o->text + o->len, text, len);
    o->len += len;
    o->text[o->len] = '\0';
}

/* Decoded text on its way to the output, through the stop strings when there are any. */
static void pass_text(app_output *o, const char *text, size_t len) {
    if (!o->stopper) {
        put_text(o, text, len);
        return;
    }
    if (o->stopped)
        return;
    const char *emit;
    size_t n;
    if (rlx_stop_matcher_push(o->stopper, text, len, &emit, &n, &o->stopped) != RLX_OK) {
        o->failed = 1;
        return;
    }
    put_text(o, emit, n);
}

/* log softmax(row)[token] and the top_n most likely ids with theirs, largest first. */
static void compute_logprobs(const float *row, int64_t vocab, int32_t token, uint32_t top_n, token_logprobs *lp) {
    const double log_z = app_log_sum_exp(row, vocab);
    lp->logprob = (float)(row[token] - log_z);
    uint32_t n = 0;
    for (int64_t v = 0; v < vocab && top_n > 0; v++) {
        /* insertion into the short sorted list; ties keep the lower id first */
        if (n == top_n && row[v] <= row[lp->top_ids[n - 1]])
            continue;
        uint32_t at = n < top_n ? n++ : n - 1;
        while (at > 0 && row[lp->top_ids[at - 1]] < row[v]) {
            lp->top_ids[at] = lp->top_ids[at - 1];
            at--;
        }
        lp->top_ids[at] = (int32_t)v;
    }
    for (uint32_t i = 0; i < n; i++)
        lp->top_logprobs[i] = (float)(row[lp->top_ids[i]] - log_z);
    lp->n_top = n;
}

int app_output_token(app_output *o, int32_t token, const float *logits) {
    if (o->opts.json) {
        if (o->n_ids == o->cap_ids) {
            size_t cap = o->cap_ids ? 2 * o->cap_ids : 64;
            int32_t *ids = realloc(o->ids, cap * sizeof *ids);
            token_logprobs *lp = ids && o->opts.logprobs ? realloc(o->lp, cap * sizeof *lp) : o->lp;
            if (ids)
                o->ids = ids;
            if (!ids || (o->opts.logprobs && !lp)) {
                o->failed = 1;
                return 1;
            }
            o->lp = lp;
            o->cap_ids = cap;
        }
        if (o->opts.logprobs && logits)
            compute_logprobs(logits, o->opts.vocab, token, o->opts.top_logprobs, &o->lp[o->n_ids]);
        else if (o->opts.logprobs) /* no row to score it by: null in the JSON */
            o->lp[o->n_ids] = (token_logprobs){.logprob = NAN};
        o->ids[o->n_ids++] = token;
    }
    if (o->detok) {
        const char *text;
        size_t len;
        if (rlx_detok_push(o->detok, token, &text, &len) != RLX_OK)
            o->failed = 1;
        else
            pass_text(o, text, len);
    } else if (!o->opts.json) {
        if (fprintf(o->opts.out, o->n_printed++ ? " %d" : "%d", token) < 0 || fflush(o->opts.out) != 0)
            o->failed = 1;
    }
    return o->failed || o->stopped;
}

void app_json_add_token_text(cJSON *obj, const rlx_tokenizer *tok, int32_t id) {
    char *text = NULL;
    size_t len = 0;
    if (rlx_tokenizer_decode(tok, &id, 1, 0, &text, &len) != RLX_OK)
        return;
    char *valid = malloc(3 * len + 1);
    size_t n = 0;
    cJSON *bytes = cJSON_AddArrayToObject(obj, "bytes");
    for (size_t i = 0; i < len; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)text[i]));
    for (utf8proc_ssize_t i = 0; valid && i < (utf8proc_ssize_t)len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t step = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)len - i, &cp);
        if (step < 0) {
            memcpy(valid + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        } else {
            memcpy(valid + n, text + i, (size_t)step);
            n += (size_t)step;
            i += step;
        }
    }
    if (valid) {
        valid[n] = '\0';
        cJSON_AddStringToObject(obj, "token", valid);
    }
    free(valid);
    free(text);
}

static cJSON *logprob_item(const app_output *o, int32_t id, float logprob) {
    cJSON *item = cJSON_CreateObject();
    cJSON_AddNumberToObject(item, "id", id);
    if (o->opts.tok)
        app_json_add_token_text(item, o->opts.tok, id);
    cJSON_AddNumberToObject(item, "logprob", logprob);
    return item;
}

static char *json_object(const app_output *o, const app_finish *f) {
    const rlx_gen_stats *st = f->stats;
    cJSON *root = cJSON_CreateObject();
    if (o->opts.tok)
        cJSON_AddStringToObject(root, "text", o->text ? o->text : "");
    /* built by hand: cJSON_CreateIntArray returns NULL for no ids, which would drop the key (-n 0) */
    cJSON *tokens = cJSON_AddArrayToObject(root, "tokens");
    for (size_t i = 0; i < o->n_ids; i++)
        cJSON_AddItemToArray(tokens, cJSON_CreateNumber(o->ids[i]));
    const int length = strcmp(f->stopped_by, "max_tokens") == 0 || strcmp(f->stopped_by, "context") == 0;
    cJSON_AddStringToObject(root, "finish_reason", length ? "length" : "stop");
    cJSON_AddStringToObject(root, "stopped_by", f->stopped_by);
    cJSON_AddNumberToObject(root, "n_prompt", st->n_prompt);
    cJSON_AddNumberToObject(root, "n_generated", st->n_generated);
    char seed[32]; /* a 64-bit seed does not fit a JSON number that readers keep exact */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)f->seed);
    cJSON_AddStringToObject(root, "seed", seed);
    cJSON_AddBoolToObject(root, "greedy", f->greedy);
    cJSON *t = cJSON_AddObjectToObject(root, "timings");
    cJSON_AddNumberToObject(t, "prompt_seconds", st->prompt_seconds);
    cJSON_AddNumberToObject(t, "prompt_tokens_per_second",
                            st->prompt_seconds > 0 ? st->n_prompt / st->prompt_seconds : 0);
    cJSON_AddNumberToObject(t, "generate_seconds", st->generate_seconds);
    cJSON_AddNumberToObject(
        t, "generate_tokens_per_second",
        st->n_generated > 1 && st->generate_seconds > 0 ? (st->n_generated - 1) / st->generate_seconds : 0);
    if (o->opts.logprobs) {
        cJSON *content = cJSON_AddArrayToObject(root, "logprobs");
        for (size_t i = 0; i < o->n_ids; i++) {
            cJSON *item = logprob_item(o, o->ids[i], o->lp[i].logprob);
            cJSON *top = cJSON_AddArrayToObject(item, "top_logprobs");
            for (uint32_t k = 0; k < o->lp[i].n_top; k++)
                cJSON_AddItemToArray(top, logprob_item(o, o->lp[i].top_ids[k], o->lp[i].top_logprobs[k]));
            cJSON_AddItemToArray(content, item);
        }
    }
    char *printed = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return printed;
}

int app_output_finish(app_output *o, const app_finish *f) {
    if (o->detok && !o->failed) {
        const char *rest = "";
        size_t len = 0;
        rlx_detok_flush(o->detok, &rest, &len);
        pass_text(o, rest, len);
    }
    if (o->stopper && !o->stopped && !o->failed) {
        const char *rest;
        size_t len;
        rlx_stop_matcher_flush(o->stopper, &rest, &len);
        put_text(o, rest, len);
    }
    if (o->failed)
        return app_fail("generate: cannot write the output");
    if (o->opts.json) {
        char *json = json_object(o, f);
        int ok = json && fputs(json, o->opts.out) >= 0;
        free(json);
        if (!ok)
            return app_fail("generate: cannot write the JSON output");
    }
    if (fputc('\n', o->opts.out) == EOF || fflush(o->opts.out) != 0)
        return app_fail("generate: cannot write to stdout");
    return 0;
}
