/* Shared pieces of the rlx model commands: the runtime they run on, sampling and speculation
 * options. */
#ifndef RLX_APP_COMMON_H
#define RLX_APP_COMMON_H

#include <stdint.h>

#include "cli.h"
#include "pipeline.h"
#include "rlx/rlx.h"

/* What a command runs on: the core runtime (rlx/runtime.h) and, over a pipeline, the stage
 * processes this command launched (pipeline.c). The members below the runtime are views
 * borrowed from it. */
typedef struct app_runtime {
    rlx_runtime *runtime;
    rlx_lm lm; /* what commands run: the local session or a pipeline driver */
    const char *model_dir;
    const rlx_model *model; /* NULL over a pipeline */
    rlx_session *session;   /* NULL over a pipeline */
    rlx_backend *backend;   /* the main backend, NULL for the reference kernels */
    rlx_speculator *spec;   /* NULL unless a speculator was asked for */
    uint32_t draft_tokens;  /* the speculator's tokens per round */
    app_pipeline *pipeline; /* set when running over stages (pipeline.c) */
} app_runtime;

/* For messages about a full context of `capacity` positions: its size and how --ctx could make
 * it longer, "256 positions; --ctx raises it up to 1024" (the model's max_position_embeddings)
 * or "1024 positions, the model's maximum". Written to buf (80 bytes are enough), returned. */
const char *app_describe_context(const app_runtime *rt, uint32_t capacity, char *buf, size_t size);

/* Sampling options shared by generate and chat: what the command line gave, and the parameters
 * resolved from it and the defaults (app_generation_defaults). */
#define APP_MAX_STOPS 16
/* -l/--logit-bias options a command takes. */
#define APP_MAX_LOGIT_BIAS 64

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
    int random_seed;                  /* --seed -1 (llama.cpp's): a new seed, whatever the deployment file says */
    const char *stops[APP_MAX_STOPS]; /* --stop, in order */
    size_t n_stops;
    rlx_logit_bias biases[APP_MAX_LOGIT_BIAS]; /* -l/--logit-bias, in order */
    size_t n_biases;
    int seed_drawn; /* no seed was given: params.seed was drawn at random */
} app_sampling;

app_opt_group app_sampling_group(app_sampling *s);
/* A seed nobody chose (getrandom, else the clock and the pid): each run samples differently. */
uint64_t app_fresh_seed(void);
/* Checks the combination of sampling options; 1 after reporting a conflict. */
int app_sampling_finish(app_sampling *s);
/* The sampling flags given (--greedy, --temp, --top-k, ...) over p. */
void app_sampling_apply_flags(const app_sampling *s, rlx_sampler_params *p);

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
/* app_runtime_open with RLX_RUNTIME_* flags: RLX_RUNTIME_STAGE opens the model and backends
 * without a session (rt->lm and rt->session stay empty), for rlx serve's engine. */
int app_runtime_open_flags(app_runtime *rt, app_options *o, const app_spec_options *so, uint32_t flags);
void app_runtime_close(app_runtime *rt);
/* Warns on stderr when positions (a context, or a slot's) are past the model's trained length. */
void app_warn_beyond_trained(const app_runtime *rt, uint32_t positions);

/* The model's tokenizer: from the open model when this process holds one, the runtime's or the
 * one a pipeline's driver opened for its metadata (a GGUF model's comes from the header parsed
 * at open, not a second parse), else from the model path. The status of rlx_tokenizer_open. */
rlx_status app_tokenizer_open(const app_runtime *rt, rlx_tokenizer **tok);

/* The help of --special-in-content (rlx serve, chat and generate --chat). */
#define APP_SPECIAL_IN_CONTENT_HELP                                                                                    \
    "parse special tokens (<|im_start|> ...) written inside chat messages, as\n"                                       \
    "older rlx did: a message can then forge turns of other roles (by default\n"                                       \
    "only the chat template's own markup is special and message text is text)"

/* The help of --chat-template-file (rlx serve, chat and generate --chat). */
#define APP_CHAT_TEMPLATE_FILE_HELP                                                                                    \
    "render chats with the Jinja chat template in FILE instead of the model's\n"                                       \
    "own (tokenizer_config.json, chat_template.jinja or GGUF)"

/* Reads --chat-template-file FILE (NULL: none, *text stays NULL). 1 after reporting. */
int app_chat_template_file(const char *cmd, const char *path, char **text);

/* The chat a command renders: msgs, or (when messages_json is not NULL, msgs NULL and n 0) the
 * messages as JSON with tool calls, and the tools (JSON, or NULL). */
typedef struct app_chat {
    const rlx_chat_message *msgs;
    size_t n;
    const char *messages_json, *tools_json;
} app_chat;

/* rlx_chat_render_spans of chat with Qwen3's enable_thinking as think, through chat_template
 * (the text of --chat-template-file) or, when it is NULL, the model's template. kwargs_json:
 * more chat_template_kwargs (a JSON object) or NULL; its enable_thinking, if any, wins. */
rlx_status app_chat_render(const rlx_tokenizer *tok, const app_chat *chat, int think, const char *chat_template,
                           const char *kwargs_json, char **out, rlx_text_span **markup, size_t *n_markup);

/* Encodes text rendered by rlx_chat_render_spans: special tokens count only in its markup spans,
 * so that <|im_start|> typed in a message stays those characters, unless special_in_content
 * (then everywhere). max_ids and *truncated as rlx_encode_options' and rlx_tokenizer_encode_ex's
 * (0: no limit). The status of rlx_tokenizer_encode_ex. */
rlx_status app_encode_chat(const rlx_tokenizer *tok, const char *text, const rlx_text_span *markup, size_t n_markup,
                           int special_in_content, size_t max_ids, int32_t **ids, size_t *n_ids, int *truncated);

/* Resolves s->params from the command line over the defaults: the deployment file's
 * generation: section (when rt runs one), else the model's generation_config.json, else greedy;
 * a random seed unless one was given. Sets *max_new from the file unless max_new_given. 1 after
 * reporting a problem (a malformed generation_config.json). */
int app_generation_defaults(const app_runtime *rt, app_sampling *s, uint32_t *max_new, int max_new_given);

int cmd_plugins(int argc, char **argv, app_options *o);
int cmd_logits(int argc, char **argv, app_options *o);
int cmd_generate(int argc, char **argv, app_options *o);
int cmd_bench(int argc, char **argv, app_options *o);
int cmd_perplexity(int argc, char **argv, app_options *o);
int cmd_graph(int argc, char **argv, app_options *o);
int cmd_chat(int argc, char **argv, app_options *o);
int cmd_tokenize(int argc, char **argv, app_options *o);
int cmd_detokenize(int argc, char **argv, app_options *o);
int cmd_stage(int argc, char **argv, app_options *o);
int cmd_quantize(int argc, char **argv, app_options *o);
int cmd_serve(int argc, char **argv, app_options *o);

#endif
