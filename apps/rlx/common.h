/* Shared pieces of the rlx commands: option parsing, model and backend setup, reporting. */
#ifndef RLX_APP_COMMON_H
#define RLX_APP_COMMON_H

#include <stdint.h>

#include "opts.h"
#include "pipeline.h"
#include "rlx/rlx.h"

typedef struct app_options {
    const char *model;
    const char *plugin; /* backend plugin name, "ref" for the reference kernels only */
    const char *plugin_dir;
    const char *place;        /* "op=plugin,op=plugin": per-op placement, NULL for none */
    const char *backend_opts; /* --backend-opts "key=value,...": options of --plugin's backend only */
    uint32_t threads;
    uint32_t ctx;
    int verbose;
    app_pipeline_options pipeline; /* --config, --stages, --launch, --transport, timeouts */
} app_options;

/* What a command runs on: the core runtime (rlx/runtime.h) and, over a pipeline, the stage
 * processes this command launched (pipeline.c). The members below the runtime are views
 * borrowed from it. */
typedef struct app_runtime {
    rlx_runtime *runtime;
    rlx_lm lm; /* what commands run: the local session or a pipeline driver */
    const char *model_dir;
    const rlx_model *model;        /* NULL over a pipeline */
    rlx_session *session;          /* NULL over a pipeline */
    rlx_backend *backend;          /* the main backend, NULL for the reference kernels */
    rlx_speculator *spec;          /* NULL unless a speculator was asked for */
    uint32_t draft_tokens;         /* the speculator's tokens per round */
    struct app_pipeline *pipeline; /* set when running over stages (pipeline.c) */
} app_runtime;

/* Prints "rlx: <message>" on stderr and returns 1 (the exit status for failures). */
int app_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Reports the last rlx error with a prefix and returns 1. */
int app_fail_rlx(const char *what);

/* The options every model command shares (model, backends, threads, context, -v), writing
 * into o; app_model_group has --model alone, for the commands that only read a tokenizer. */
app_opt_group app_common_group(app_options *o);
app_opt_group app_model_group(app_options *o);
/* Parses a command's argv against its groups: 0 to go on, else the command's exit status
 * (0 after --help or --version, 1 after reporting an error). */
int app_parse_command(const char *name, const char *usage, const app_opt_group *groups, size_t n_groups, int argc,
                      char **argv, int *exit_status);
/* Warns on stderr when threads exceeds the cores this process may run on. */
void app_warn_threads(uint32_t threads);
int app_parse_u32(const char *opt, const char *text, uint32_t *out);
/* -n's value for "until an end-of-sequence token or a full context" (-n -1). */
#define APP_MAX_NEW_UNTIL_FULL UINT32_MAX
/* Parses the value of -n into a uint32_t: a token count, or -1 for APP_MAX_NEW_UNTIL_FULL; -1
 * after reporting (an APP_OPT_CUSTOM parser). */
int app_parse_max_new(const char *opt, const char *text, void *target);
int app_parse_float(const char *opt, const char *text, float *out);
/* Parses "1,5,3" or "1 5 3" (what rlx tokenize prints) into a malloc'd array; returns the
 * count or -1 after reporting a problem with option opt. */
int app_parse_tokens(const char *opt, const char *text, int32_t **out);
/* The whole file at path ("-": standard input), NUL-terminated, in a malloc'd buffer of *len
 * bytes; with drop_final_newline, one final newline is left out (as llama.cpp's -f reads a
 * prompt). NULL after reporting (prefixed with what). */
char *app_read_file(const char *what, const char *path, int drop_final_newline, size_t *len);
/* log(sum(exp(row[0 .. n)))), computed stably: log_softmax(row)[i] = row[i] - this. */
double app_log_sum_exp(const float *row, int64_t n);

/* Logical cores this process may run on (sched_getaffinity), at least 1. */
uint32_t app_usable_cores(void);

/* For messages about a full context of `capacity` positions: its size and how --ctx could make
 * it longer, "256 positions; --ctx raises it up to 1024" (the model's max_position_embeddings)
 * or "1024 positions, the model's maximum". Written to buf (80 bytes are enough), returned. */
const char *app_describe_context(const app_runtime *rt, uint32_t capacity, char *buf, size_t size);

/* Sampling options shared by generate and chat: what the command line gave, and the parameters
 * resolved from it and the defaults (app_generation_defaults). */
#define APP_MAX_STOPS 16

/* Sampling settings one source gives (the command line, a deployment file, a model's
 * generation_config.json): each value with a flag saying the source gave it. */
typedef struct app_sampling_values {
    int has_temperature, has_top_k, has_top_p, has_min_p, has_repeat_penalty, has_repeat_last_n, has_presence_penalty,
        has_frequency_penalty;
    float temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int32_t top_k, repeat_last_n;
} app_sampling_values;

typedef struct app_sampling {
    rlx_sampler_params params; /* resolved */
    int greedy;                /* --greedy */
    app_sampling_values given; /* the other sampling options */
    uint64_t seed;
    int has_seed;
    const char *stops[APP_MAX_STOPS]; /* --stop, in order */
    size_t n_stops;
    int seed_drawn; /* no seed was given: params.seed was drawn at random */
} app_sampling;

app_opt_group app_sampling_group(app_sampling *s);
/* Checks the combination of sampling options; 1 after reporting a conflict. */
int app_sampling_finish(app_sampling *s);

/* Speculative decoding options of generate. */
typedef struct app_spec_options {
    const char *name;        /* --spec NAME: speculator plugin; NULL = the deployment file's, if any */
    uint32_t draft_tokens;   /* --draft-tokens K; 0 = not given */
    const char *draft_model; /* --draft-model DIR: adds the option model=DIR */
    const char *options;     /* --spec-opts "key=value,...": the plugin's options */
} app_spec_options;

app_opt_group app_spec_group(app_spec_options *s);

/* Opens the runtime the command line describes: --model and the backend options for a run in
 * this process, or the pipeline options (launching local stages when asked); so, when not NULL,
 * adds the speculator the command line names, or else the deployment file's. 1 after
 * reporting a failure, with everything closed. */
int app_runtime_open(app_runtime *rt, app_options *o, const app_spec_options *so);
void app_runtime_close(app_runtime *rt);

/* Resolves s->params from the command line over the defaults: the deployment file's
 * generation: section (when rt runs one), else the model's generation_config.json, else greedy;
 * a random seed unless one was given. Sets *max_new from the file unless max_new_given. 1 after
 * reporting a problem (a malformed generation_config.json). */
int app_generation_defaults(const app_runtime *rt, app_sampling *s, uint32_t *max_new, int max_new_given);

/* Sets o->model to the demo model when no --model was given: $RLX_MODEL, else demo-model in
 * the build tree or share/rlx/demo-model of the installed tree. 1 after reporting none found. */
int app_resolve_model(app_options *o);

int cmd_plugins(int argc, char **argv, app_options *o);
int cmd_logits(int argc, char **argv, app_options *o);
int cmd_generate(int argc, char **argv, app_options *o);
int cmd_bench(int argc, char **argv, app_options *o);
int cmd_perplexity(int argc, char **argv, app_options *o);
int cmd_graph(int argc, char **argv, app_options *o);
int cmd_chat(int argc, char **argv, app_options *o);
int cmd_tokenize(int argc, char **argv, app_options *o);
int cmd_detokenize(int argc, char **argv, app_options *o);

#endif
