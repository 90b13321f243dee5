/* Runtime setup, sampling and speculation options shared by the rlx model commands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common.h"
#include "rlx/private.h"

#define PROGRESS_MIN_BYTES ((size_t)256 << 20)

/* The runtime options the command line gives; over a pipeline, after launching the local stages
 * asked for. Backends without --threads get the driver's share of the cores when it launched
 * local stages and drafts itself, else their own default. 1 after reporting. */
static int runtime_options(app_runtime *rt, app_options *o, const app_spec_options *so, rlx_runtime_options *ro,
                           rlx_runtime_backend *main_backend) {
    static const app_spec_options none = {0};
    if (!so)
        so = &none;
    const rlx_deploy *d = app_pipeline_deploy(rt->pipeline);
    const int drafts = so->name || (d && rlx_deploy_speculator_of(d));
    if (!drafts && (so->draft_tokens || so->draft_model || so->options))
        return app_fail("--draft-tokens, --draft-model and --spec-opts need --spec NAME");
    uint32_t share = 0;
    if (rt->pipeline && app_pipeline_launch(rt->pipeline, o, &o->pipeline, drafts, ro, &share))
        return 1;
    if (!rt->pipeline) {
        if (app_resolve_model(o))
            return 1;
        ro->model_dir = o->model;
    }
    if (!rt->pipeline || drafts)
        app_warn_threads(o->threads);
    *main_backend = (rlx_runtime_backend){.name = o->plugin ? o->plugin : "cpu-blas", .options = o->backend_opts};
    ro->backends = main_backend;
    ro->n_backends = 1;
    ro->place = o->place;
    ro->n_threads = o->threads ? o->threads : share;
    ro->plugin_dir = o->plugin_dir;
    ro->kv_capacity = o->ctx;
    ro->n_slots = o->slots;
    ro->recovery_timeout_ms = o->pipeline.recovery_timeout_ms;
    ro->no_recovery = (uint32_t)o->pipeline.no_recovery;
    ro->speculator = so->name;
    ro->draft_tokens = so->draft_tokens;
    ro->draft_model = so->draft_model;
    ro->spec_options = so->options;
    ro->quant = o->quant;
    const int kv_dtype = app_kv_dtype(o);
    if (kv_dtype < 0)
        return 1;
    ro->kv_dtype = (uint32_t)kv_dtype;
    ro->check_finite = (uint32_t)o->check_finite;
    return 0;
}

/* With -v, what librlx and the plugins log (the backends' describe lines, a transport's own
 * account of a failed connect). */
/* Warnings (a pipeline stage lost and replaced) always; the rest with -v. */
static void print_log(void *ctx, int level, const char *message) {
    const int *verbose = ctx;
    if (level <= RLX_LOG_WARN || *verbose)
        fprintf(stderr, "rlx: %s\n", message);
}

/* The progress bar's state: drawn once the model is big enough to be worth one. */
typedef struct progress_bar {
    int drawn;
} progress_bar;

static void show_progress(void *ctx, size_t done, size_t total) {
    progress_bar *bar = ctx;
    if (total < PROGRESS_MIN_BYTES)
        return;
    bar->drawn = 1;
    int width = 40, filled = (int)((double)done / (double)total * width);
    fprintf(stderr, "\rloading [%.*s%*s] %5.1f%% of %.0f MiB", filled,
            "========================================", width - filled, "", 100.0 * (double)done / (double)total,
            (double)total / 1048576.0);
    fflush(stderr);
}

int app_runtime_open(app_runtime *rt, app_options *o, const app_spec_options *so) {
    return app_runtime_open_flags(rt, o, so, 0);
}

int app_runtime_open_flags(app_runtime *rt, app_options *o, const app_spec_options *so, uint32_t flags) {
    memset(rt, 0, sizeof *rt);
    if (app_pipeline_wanted(&o->pipeline) && app_pipeline_load(&rt->pipeline, &o->pipeline))
        return 1;
    rlx_runtime_options ro = rlx_runtime_options_default();
    /* a context the user asked for is theirs, past the trained length too (llama.cpp's
     * behaviour), with the warning below */
    ro.flags = flags | (o->ctx ? RLX_RUNTIME_BEYOND_TRAINED : 0);
    rlx_runtime_backend main_backend;
    if (runtime_options(rt, o, so, &ro, &main_backend))
        return app_runtime_close(rt), 1;
    /* a terminal gets a progress bar while a large model is read in; elsewhere pages fault in lazily */
    progress_bar bar = {0};
    if (isatty(STDERR_FILENO)) {
        ro.progress = show_progress;
        ro.progress_ctx = &bar;
    }
    rlx_log_set_handler(print_log, &o->verbose);
    rlx_status rc = rlx_runtime_open(&ro, &rt->runtime);
    if (bar.drawn)
        fputs("\r\033[K", stderr);
    if (rc != RLX_OK)
        return app_fail("%s", rlx_last_error()), app_runtime_close(rt), 1;
    if (rlx_runtime_lm(rt->runtime))
        rt->lm = *rlx_runtime_lm(rt->runtime);
    rt->model_dir = rlx_runtime_model_dir(rt->runtime);
    rt->model = rlx_runtime_model(rt->runtime);
    rt->session = rlx_runtime_session(rt->runtime);
    rt->backend = rlx_runtime_main_backend(rt->runtime);
    rt->spec = rlx_runtime_speculator(rt->runtime);
    rt->draft_tokens = rlx_runtime_draft_tokens(rt->runtime);
    if (rt->session)
        app_warn_beyond_trained(rt, rlx_session_capacity(rt->session));
    return 0;
}

void app_warn_beyond_trained(const app_runtime *rt, uint32_t positions) {
    const rlx_model_config *c = rt->runtime ? rlx_runtime_config(rt->runtime) : NULL;
    if (c && c->max_position_embeddings > 0 && positions > c->max_position_embeddings)
        fprintf(stderr,
                "rlx: warning: a context of %u positions is past the %lld the model was trained on "
                "(max_position_embeddings): text at the later positions may degrade\n",
                positions, (long long)c->max_position_embeddings);
}

void app_runtime_close(app_runtime *rt) {
    rlx_runtime_close(rt->runtime);
    app_pipeline_close(rt->pipeline);
    rlx_log_set_handler(NULL, NULL);
    memset(rt, 0, sizeof *rt);
}

/* The open model whose parsed header serves the metadata: the runtime's, or over a pipeline the
 * one the driver opened to split the layers; NULL when neither is open. */
static const rlx_model *metadata_model(const app_runtime *rt) {
    return rt->model ? rt->model : app_pipeline_model(rt->pipeline);
}

rlx_status app_tokenizer_open(const app_runtime *rt, rlx_tokenizer **tok) {
    const rlx_model *m = metadata_model(rt);
    return m ? rlx_tokenizer_open_model(m, tok) : rlx_tokenizer_open(rt->model_dir, tok);
}

int app_chat_template_file(const char *cmd, const char *path, char **text) {
    *text = NULL;
    if (!path)
        return 0;
    char what[64];
    snprintf(what, sizeof what, "%s: --chat-template-file", cmd);
    size_t len;
    *text = app_read_file(what, path, 0, &len);
    if (!*text)
        return 1;
    if (strlen(*text) != len) {
        free(*text);
        *text = NULL;
        return app_fail("%s: --chat-template-file %s holds a NUL byte", cmd, path);
    }
    return 0;
}

rlx_status app_chat_render(const rlx_tokenizer *tok, const app_chat *chat, int think, const char *chat_template,
                           const char *kwargs_json, char **out, rlx_text_span **markup, size_t *n_markup) {
    cJSON *kwargs = kwargs_json ? cJSON_Parse(kwargs_json) : cJSON_CreateObject();
    if (!cJSON_IsObject(kwargs)) {
        cJSON_Delete(kwargs);
        return rlx_error(RLX_E_INVALID, "chat_template_kwargs must be a JSON object");
    }
    char *text = NULL;
    if ((cJSON_HasObjectItem(kwargs, "enable_thinking") || cJSON_AddBoolToObject(kwargs, "enable_thinking", think)))
        text = cJSON_PrintUnformatted(kwargs);
    cJSON_Delete(kwargs);
    if (!text)
        return rlx_error(RLX_E_NOMEM, "out of memory");
    rlx_chat_options o = {
        .size = sizeof o, .add_generation_prompt = 1, .kwargs_json = text, .chat_template = chat_template};
    o.messages_json = chat->messages_json;
    o.tools_json = chat->tools_json;
    rlx_status st = rlx_chat_render_ex(tok, chat->msgs, chat->n, &o, out, markup, n_markup);
    free(text);
    return st;
}

rlx_status app_encode_chat(const rlx_tokenizer *tok, const char *text, const rlx_text_span *markup, size_t n_markup,
                           int special_in_content, size_t max_ids, int32_t **ids, size_t *n_ids, int *truncated) {
    static const rlx_text_span no_markup; /* a rendering may have none; NULL would mean "no spans" */
    /* no add_special: a chat template writes bos_token itself, and Hugging Face's
     * apply_chat_template encodes without add_special_tokens, so there is never a second BOS */
    rlx_encode_options eo = {.size = sizeof eo, .parse_special = 1, .max_ids = max_ids};
    if (!special_in_content) {
        eo.special_spans = markup ? markup : &no_markup;
        eo.n_special_spans = markup ? n_markup : 0;
    }
    return rlx_tokenizer_encode_ex(tok, text, strlen(text), &eo, ids, n_ids, truncated);
}

const char *app_describe_context(const app_runtime *rt, uint32_t capacity, char *buf, size_t size) {
    const rlx_model_config *c = rt->runtime ? rlx_runtime_config(rt->runtime) : NULL;
    int64_t max_pos = c ? c->max_position_embeddings : 0;
    if (max_pos > 0 && max_pos <= capacity)
        snprintf(buf, size, "%u positions, the model's maximum", capacity);
    else if (max_pos > 0)
        snprintf(buf, size, "%u positions; --ctx raises it up to %lld", capacity, (long long)max_pos);
    else
        snprintf(buf, size, "%u positions; --ctx raises it", capacity);
    return buf;
}

static int add_stop(const char *opt, const char *value, void *target) {
    app_sampling *s = target;
    if (!*value)
        return app_fail("%s: an empty stop string would stop before the first token", opt), -1;
    if (s->n_stops == APP_MAX_STOPS)
        return app_fail("%s: at most %d stop strings", opt, APP_MAX_STOPS), -1;
    s->stops[s->n_stops++] = value;
    return 0;
}

/* llama.cpp's -l TOKEN_ID(+|-)BIAS: "15043+1.5", "15043-1", "15043-inf" (a ban). */
static int add_logit_bias(const char *opt, const char *value, void *target) {
    app_sampling *s = target;
    char *end;
    errno = 0;
    const long id = strtol(value, &end, 10);
    if (end == value || errno || id < 0 || id > INT32_MAX || (*end != '+' && *end != '-'))
        return app_fail("%s: '%s' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1.5, 15043-inf)", opt, value), -1;
    const char *num = end;
    float bias;
    if (!strcmp(num, "-inf"))
        bias = -INFINITY;
    else {
        errno = 0;
        const double v = strtod(num, &end);
        if (end == num || *end || errno || !isfinite(v))
            return app_fail("%s: '%s': the bias '%s' is not a finite number (or -inf)", opt, value, num), -1;
        bias = (float)v;
    }
    if (s->n_biases == APP_MAX_LOGIT_BIAS)
        return app_fail("%s: at most %d logit biases", opt, APP_MAX_LOGIT_BIAS), -1;
    s->biases[s->n_biases++] = (rlx_logit_bias){(int32_t)id, bias};
    return 0;
}

/* A seed, or llama.cpp's -1 for a new one each run. */
static int parse_seed(const char *opt, const char *value, void *target) {
    app_sampling *s = target;
    if (strcmp(value, "-1") == 0) {
        s->has_seed = 0;
        s->random_seed = 1;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno || end == value || *end || value[0] == '-')
        return app_fail("%s: '%s' is not a seed (a non-negative integer, or -1 for a new one each run)", opt, value),
               -1;
    s->seed = v;
    s->has_seed = 1;
    s->random_seed = 0;
    return 0;
}

app_opt_group app_sampling_group(app_sampling *s) {
    static app_opt opts[12];
    app_opt list[] = {
        {0, "greedy", NULL, NULL, "always take the most likely token", APP_OPT_FLAG, &s->greedy},
        {0, "temp", NULL, "T", "sampling temperature (>= 0; 0, or below 1.18e-38, = greedy)", APP_OPT_FLOAT,
         &s->given.temperature, &s->given.has_temperature},
        {0, "top-k", NULL, "K", "keep the K most likely tokens (0 = all)", APP_OPT_INT, &s->given.top_k,
         &s->given.has_top_k},
        {0, "top-p", NULL, "P", "keep the smallest set of tokens whose probability reaches P (1 = off)", APP_OPT_FLOAT,
         &s->given.top_p, &s->given.has_top_p},
        {0, "min-p", NULL, "P", "drop tokens less likely than P times the most likely one (0 = off)", APP_OPT_FLOAT,
         &s->given.min_p, &s->given.has_min_p},
        {0, "repeat-penalty", NULL, "R",
         "divide the positive logits (multiply the negative ones) of tokens in the\n"
         "last --repeat-last-n by R (Hugging Face's repetition_penalty; 1 = off)",
         APP_OPT_FLOAT, &s->given.repeat_penalty, &s->given.has_repeat_penalty},
        {0, "repeat-last-n", NULL, "N", "how many recent tokens the penalties look at (default 64; -1 = all, 0 = off)",
         APP_OPT_INT, &s->given.repeat_last_n, &s->given.has_repeat_last_n},
        {0, "presence-penalty", NULL, "A", "subtract A from the logits of tokens in that window (OpenAI's; 0 = off)",
         APP_OPT_FLOAT, &s->given.presence_penalty, &s->given.has_presence_penalty},
        {0, "frequency-penalty", NULL, "A", "subtract A times a token's count in that window (OpenAI's; 0 = off)",
         APP_OPT_FLOAT, &s->given.frequency_penalty, &s->given.has_frequency_penalty},
        {'s', "seed", NULL, "S", "random seed (default and -1: a new one each run, printed by --stats)", APP_OPT_CUSTOM,
         s, .parse = parse_seed},
        {0, "stop", NULL, "TEXT",
         "end the reply before TEXT appears (repeatable; TEXT is never printed,\n"
         "even when it spans tokens)",
         APP_OPT_CUSTOM, s, .parse = add_stop},
        {'l', "logit-bias", NULL, "ID(+|-)B",
         "add B to token ID's logit before sampling, as llama.cpp's -l (repeatable;\n"
         "ID-inf bans the token)",
         APP_OPT_CUSTOM, s, .parse = add_logit_bias},
    };
    memcpy(opts, list, sizeof opts);
    return APP_OPT_GROUP("sampling (defaults: the deployment file's generation: section, else the model's\n"
                         "generation_config.json, else greedy):",
                         opts);
}

int app_sampling_finish(app_sampling *s) {
    const app_sampling_values *g = &s->given;
    if (s->greedy && (g->has_temperature || g->has_top_k || g->has_top_p || g->has_min_p))
        return app_fail("--greedy cannot be combined with --temp, --top-k, --top-p or --min-p");
    return 0;
}

uint64_t app_fresh_seed(void) {
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, 0) == (ssize_t)sizeof seed)
        return seed;
    struct timespec ts; /* no entropy source: the clock and the process still differ per run */
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 42);
}

/* One source of sampling settings, lowest first: generation_config.json, the deployment file,
 * the command line. `decides` says the source names a sampling key, so it chooses between
 * greedy and sampling (greedy when it says temperature 0). */
typedef struct sampling_layer {
    int decides, greedy;
    app_sampling_values v;
} sampling_layer;

static void apply_layer(rlx_sampler_params *p, const sampling_layer *l) {
    const app_sampling_values *v = &l->v;
    if (l->decides)
        p->greedy = l->greedy;
    if (v->has_temperature)
        p->temperature = v->temperature;
    if (v->has_top_k)
        p->top_k = v->top_k;
    if (v->has_top_p)
        p->top_p = v->top_p;
    if (v->has_min_p)
        p->min_p = v->min_p;
    if (v->has_repeat_penalty)
        p->repeat_penalty = v->repeat_penalty;
    if (v->has_repeat_last_n)
        p->repeat_last_n = v->repeat_last_n;
    if (v->has_presence_penalty)
        p->presence_penalty = v->presence_penalty;
    if (v->has_frequency_penalty)
        p->frequency_penalty = v->frequency_penalty;
}

/* Hugging Face's meaning: do_sample decides; its repetition penalty covers the whole context. */
static sampling_layer model_layer(const rlx_generation_defaults *d) {
    sampling_layer l = {.decides = d->has_do_sample, .greedy = !d->do_sample};
    app_sampling_values *v = &l.v;
    if (d->do_sample) { /* without do_sample the sampling keys do nothing in Hugging Face either */
        v->has_temperature = v->has_top_k = v->has_top_p = 1;
        v->temperature = d->temperature;
        v->top_k = d->top_k;
        v->top_p = d->top_p;
        v->has_min_p = d->has_min_p;
        v->min_p = d->min_p;
    }
    if (d->has_repetition_penalty && d->repetition_penalty != 1) {
        v->has_repeat_penalty = v->has_repeat_last_n = 1;
        v->repeat_penalty = d->repetition_penalty;
        v->repeat_last_n = -1;
    }
    return l;
}

static sampling_layer deploy_layer(const rlx_deploy_generation *g) {
    return (sampling_layer){.decides = g->has_temperature || g->has_top_k || g->has_top_p || g->has_min_p,
                            .greedy = g->has_temperature && g->temperature == 0,
                            .v = {.has_temperature = g->has_temperature,
                                  .has_top_k = g->has_top_k,
                                  .has_top_p = g->has_top_p,
                                  .has_min_p = g->has_min_p,
                                  .has_repeat_penalty = g->has_repeat_penalty,
                                  .has_repeat_last_n = g->has_repeat_last_n,
                                  .has_presence_penalty = g->has_presence_penalty,
                                  .has_frequency_penalty = g->has_frequency_penalty,
                                  .temperature = g->temperature,
                                  .top_p = g->top_p,
                                  .min_p = g->min_p,
                                  .repeat_penalty = g->repeat_penalty,
                                  .presence_penalty = g->presence_penalty,
                                  .frequency_penalty = g->frequency_penalty,
                                  .top_k = g->top_k,
                                  .repeat_last_n = g->repeat_last_n}};
}

static sampling_layer flag_layer(const app_sampling *s) {
    const app_sampling_values *g = &s->given;
    return (sampling_layer){.decides = s->greedy || g->has_temperature || g->has_top_k || g->has_top_p || g->has_min_p,
                            .greedy = s->greedy || (g->has_temperature && g->temperature == 0),
                            .v = *g};
}

void app_sampling_apply_flags(const app_sampling *s, rlx_sampler_params *p) {
    const sampling_layer layer = flag_layer(s);
    apply_layer(p, &layer);
}

int app_generation_defaults(const app_runtime *rt, app_sampling *s, uint32_t *max_new, int max_new_given) {
    rlx_sampler_params *p = &s->params;
    *p = rlx_sampler_params_default();
    p->greedy = 1; /* what none of the sources below decides */
    rlx_generation_defaults model;
    const rlx_model *m = metadata_model(rt);
    if ((m ? rlx_generation_config_of(m, &model) : rlx_generation_config_load(rt->model_dir, &model)) != RLX_OK)
        return app_fail_rlx("cannot read the model's sampling defaults");
    sampling_layer layer = model_layer(&model);
    apply_layer(p, &layer);
    const rlx_deploy *d = app_pipeline_deploy(rt->pipeline);
    const rlx_deploy_generation *g = d ? rlx_deploy_generation_of(d) : NULL;
    if (g) {
        layer = deploy_layer(g);
        apply_layer(p, &layer);
    }
    layer = flag_layer(s);
    apply_layer(p, &layer);
    /* options that cannot change a greedy run are taken, but said to do nothing */
    const app_sampling_values *given = &s->given;
    if (p->greedy && (given->has_top_k || given->has_top_p || given->has_min_p || s->has_seed))
        fprintf(stderr, "rlx: warning: %s%s%s%shas no effect: decoding is greedy (%s)\n",
                given->has_top_k ? "--top-k " : "", given->has_top_p ? "--top-p " : "",
                given->has_min_p ? "--min-p " : "", s->has_seed ? "--seed " : "",
                s->greedy                ? "--greedy"
                : given->has_temperature ? "--temp 0"
                                         : "the deployment file's or model's default");
    p->logit_bias = s->n_biases ? s->biases : NULL;
    p->n_logit_bias = (uint32_t)s->n_biases;
    const int file_seed = !s->random_seed && g && g->has_seed;
    s->seed_drawn = !s->has_seed && !file_seed;
    p->seed = s->has_seed ? s->seed : file_seed ? g->seed : app_fresh_seed();
    if (!max_new_given && g && g->has_max_tokens)
        *max_new = g->max_tokens;
    return 0;
}

// ---- speculative decoding ----

static int parse_draft_tokens(const char *opt, const char *value, void *target) {
    uint32_t *k = target;
    if (app_parse_u32(opt, value, k) < 0)
        return -1;
    if (*k < 1 || *k > RLX_SPEC_MAX_DRAFT)
        return app_fail("%s must be from 1 to %d (got %u)", opt, RLX_SPEC_MAX_DRAFT, *k), -1;
    return 0;
}

app_opt_group app_spec_group(app_spec_options *s) {
    static app_opt opts[4];
    app_opt list[] = {
        {0, "spec", NULL, "NAME",
         "speculative decoding with speculator plugin NAME (draft, mtp); the\n"
         "output is the same as without it (token for token under greedy)",
         APP_OPT_STRING, &s->name},
        {0, "draft-tokens", NULL, "K", "tokens the speculator proposes per round (default 4, at most 64)",
         APP_OPT_CUSTOM, &s->draft_tokens, .parse = parse_draft_tokens},
        {0, "draft-model", NULL, "DIR", "the draft model of --spec draft (its option model=DIR)", APP_OPT_STRING,
         &s->draft_model},
        {0, "spec-opts", NULL, "OPTS", "the speculator's options, \"key=value,key=value\"", APP_OPT_STRING,
         &s->options},
    };
    memcpy(opts, list, sizeof opts);
    return APP_OPT_GROUP("speculative decoding:", opts);
}
