/* The command line's shared layer (cli.c): the options every command shares, reporting and
 * value parsers. It depends on nothing of the commands, the runtime setup or the pipeline. */
#ifndef RLX_APP_CLI_H
#define RLX_APP_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "opts.h"

typedef struct app_pipeline_options {
    const char *config;           /* --config FILE: a deployment file */
    uint32_t stages;              /* --stages N: launch N local stages on free loopback ports */
    int launch;                   /* --launch: start the config's local stages as child processes */
    const char *transport;        /* --transport NAME (overrides the file; default tcp) */
    uint32_t timeout_ms;          /* --timeout MS: control messages; 0 = the file's or the default */
    uint32_t connect_timeout_ms;  /* --connect-timeout MS */
    uint32_t per_position_ms;     /* --compute-timeout MS: extra wait per position computed */
    uint32_t recovery_timeout_ms; /* --recovery-timeout MS: replacing a lost stage; 0 = the file's */
    int no_recovery;              /* --no-recovery: a lost stage ends the command at once */
    /* --auth-token-file, --tls-ca, --tls-cert, --tls-key, --tls-name: the credentials the
     * stages require (rlx_dist_security); each overrides the file's; launched stages inherit
     * all but the name */
    const char *auth_token_file, *tls_ca, *tls_cert, *tls_key, *tls_name;
} app_pipeline_options;

typedef struct app_options {
    const char *model;
    const char *plugin; /* backend plugin name, "ref" for the reference kernels only */
    const char *plugin_dir;
    const char *place;        /* "op=plugin,op=plugin": per-op placement, NULL for none */
    const char *backend_opts; /* --backend-opts "key=value,...": options of --plugin's backend only */
    uint32_t threads;
    uint32_t ctx;
    int verbose;
    const char *quant; /* --quant TYPE: quantize a safetensors model's matrices when loading it */
    /* --cache-type-k / --cache-type-v (-ctk, -ctv): the KV cache's rlx_dtype, F16 unless given;
     * one given alone sets both (rlx keeps K and V in one type) */
    uint32_t cache_type_k, cache_type_v;
    int cache_type_k_given, cache_type_v_given;
    int check_finite;              /* --check-finite: every node's output is checked for NaN and infinity */
    app_pipeline_options pipeline; /* --config, --stages, --launch, --transport, timeouts, recovery, credentials */
    uint32_t slots;                /* over a pipeline: sequences the stages keep (rlx serve --parallel) */
} app_options;

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

/* The KV cache dtype the options ask for: RLX_DTYPE_F32 or RLX_DTYPE_F16; -1 after reporting
 * --cache-type-k and --cache-type-v that differ (rlx stores K and V in one dtype). */
int app_kv_dtype(const app_options *o);

/* Whether value is one of llama.cpp's --flash-attn values (on, off, auto, ...): the option's
 * parser takes them, and "-fa" without one is read as "-fa on". */
int app_is_flash_attn_value(const char *value);

/* Logical cores this process may run on (sched_getaffinity), at least 1. */
uint32_t app_usable_cores(void);

/* Sets o->model to the demo model when no --model was given: $RLX_MODEL, else demo-model in
 * the build tree or share/rlx/demo-model of the installed tree. 1 after reporting none found. */
int app_resolve_model(app_options *o);

#endif
