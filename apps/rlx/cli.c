/* The command line's shared layer: reporting, value parsers, the options every command shares
 * and finding the default model. Everything above it (pipeline.c, common.c, the commands) uses
 * it; it uses nothing of theirs. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "rlx/graph.h"
#include "rlx/status.h"

int app_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *body;
    if (vasprintf(&body, fmt, ap) < 0)
        body = NULL;
    va_end(ap);
    /* one fprintf, which glibc hands to the unbuffered stderr in one write(2): the ranks mpirun
     * starts share one stderr pipe with mpirun's own banners, and a message written in pieces
     * arrives with another process's text between them */
    fprintf(stderr, "rlx: %s\n", body ? body : fmt);
    free(body);
    return 1;
}

int app_fail_rlx(const char *what) {
    const char *detail = rlx_last_error();
    return app_fail("%s%s%s", what, *detail ? ": " : "", detail);
}

int app_parse_u32(const char *opt, const char *text, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-' || v > UINT32_MAX) {
        app_fail("%s: '%s' is not a non-negative integer", opt, text);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

int app_parse_max_new(const char *opt, const char *text, void *target) {
    uint32_t *out = target;
    if (strcmp(text, "-1") == 0) {
        *out = APP_MAX_NEW_UNTIL_FULL;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-' || v >= APP_MAX_NEW_UNTIL_FULL) {
        app_fail("%s: '%s' is not a number of tokens (or -1: until the end of the context)", opt, text);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

int app_parse_float(const char *opt, const char *text, float *out) {
    char *end;
    errno = 0;
    float v = strtof(text, &end);
    if (end == text || *end) {
        app_fail("%s: '%s' is not a number", opt, text);
        return -1;
    }
    /* ERANGE also flags an underflow (1e-40 is a subnormal float, 1e-50 is 0): that is a value */
    if (errno == ERANGE && isinf(v)) {
        app_fail("%s: '%s' is beyond the float range", opt, text);
        return -1;
    }
    *out = v;
    return 0;
}

int app_parse_tokens(const char *opt, const char *text, int32_t **out) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return app_fail("out of memory"), -1;
    /* commas or white space between ids, so that rlx tokenize's output is taken as it is */
    for (const char *p = text + strspn(text, ", \t\r\n"); *p; p += strspn(p, ", \t\r\n")) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && !strchr(", \t\r\n", *end))) {
            free(ids);
            app_fail("%s: '%s' is not a list of token ids (separated by commas or spaces)", opt, text);
            return -1;
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!grown) {
                free(ids);
                return app_fail("out of memory"), -1;
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (n == 0) {
        free(ids);
        app_fail("%s: no token ids given", opt);
        return -1;
    }
    *out = ids;
    return (int)n;
}

char *app_read_file(const char *what, const char *path, int drop_final_newline, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        app_fail("%s: cannot open %s: %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown)
                free(buf);
            buf = grown;
        }
    }
    const int failed = ferror(f), read_errno = errno;
    if (f != stdin)
        fclose(f);
    if (!buf || failed) {
        free(buf);
        app_fail("%s: cannot read %s: %s", what, path, failed ? strerror(read_errno) : "out of memory");
        return NULL;
    }
    if (drop_final_newline && n > 0 && buf[n - 1] == '\n') /* llama.cpp's -f: the last line break is no part of it */
        n--;
    buf[n] = '\0';
    *len = n;
    return buf;
}

double app_log_sum_exp(const float *row, int64_t n) {
    float mx = row[0];
    for (int64_t v = 1; v < n; v++)
        mx = row[v] > mx ? row[v] : mx;
    double sum = 0;
    for (int64_t v = 0; v < n; v++)
        sum += exp((double)row[v] - mx);
    return mx + log(sum);
}

app_opt_group app_model_group(app_options *o) {
    static app_opt opts[1];
    opts[0] = (app_opt){'m',
                        "model",
                        NULL,
                        "PATH",
                        "Hugging Face model directory (config.json, *.safetensors) or GGUF file\n"
                        "(the first shard of a split one); default: $RLX_MODEL, else the Brown\n"
                        "target model shipped with rlx",
                        APP_OPT_STRING,
                        &o->model};
    return APP_OPT_GROUP("model:", opts);
}

/* llama.cpp's names of the cache types rlx has (its other quantized ones are not supported) */
static int parse_cache_type(const char *opt, const char *value, uint32_t *type) {
    static const uint32_t types[] = {RLX_DTYPE_F32, RLX_DTYPE_F16, RLX_DTYPE_Q8_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(value, rlx_dtype_name((int)types[i])) == 0) {
            *type = types[i];
            return 0;
        }
    app_fail("%s: '%s' is not a KV cache type rlx has: f32, f16 or q8_0", opt, value);
    return -1;
}

/* -ctk alone sets V too, and -ctv alone K: rlx keeps one type, and llama.cpp's users give the one
 * they mean; a pair that differs is refused by app_kv_dtype. */
static int parse_cache_type_k(const char *opt, const char *value, void *target) {
    app_options *o = target;
    if (parse_cache_type(opt, value, &o->cache_type_k))
        return -1;
    o->cache_type_k_given = 1;
    if (!o->cache_type_v_given)
        o->cache_type_v = o->cache_type_k;
    return 0;
}

static int parse_cache_type_v(const char *opt, const char *value, void *target) {
    app_options *o = target;
    if (parse_cache_type(opt, value, &o->cache_type_v))
        return -1;
    o->cache_type_v_given = 1;
    if (!o->cache_type_k_given)
        o->cache_type_k = o->cache_type_v;
    return 0;
}

/* llama.cpp's -ngl N (also "auto", "all"): rlx has no GPU offload, so a script that asks for it
 * goes on with a warning rather than failing. */
static int parse_gpu_layers(const char *opt, const char *value, void *target) {
    (void)target;
    char *end;
    errno = 0;
    long n = strtol(value, &end, 10);
    const int number = !errno && end != value && !*end;
    if (!number && strcmp(value, "auto") != 0 && strcmp(value, "all") != 0)
        return app_fail("%s: '%s' is not a number of layers, auto or all", opt, value), -1;
    if (!number || n != 0)
        fprintf(stderr, "rlx: warning: %s %s: rlx has no GPU offload; every layer runs on the CPU (--plugin)\n", opt,
                value);
    return 0;
}

/* llama.cpp's -fa [on|off|auto]: every backend runs attention as one fused op of its own, so
 * there is nothing to switch. */
static int parse_flash_attn(const char *opt, const char *value, void *target) {
    (void)target;
    if (!app_is_flash_attn_value(value))
        return app_fail("%s: '%s' is not on, off or auto", opt, value), -1;
    fprintf(stderr, "rlx: note: %s has no effect: each backend runs attention as one fused op of its own\n", opt);
    return 0;
}

int app_is_flash_attn_value(const char *value) {
    static const char *const known[] = {"on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled"};
    for (size_t i = 0; value && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(value, known[i]) == 0)
            return 1;
    return 0;
}

/* llama.cpp's -b and -ub: rlx runs a prompt's positions through the graph at once. */
static int parse_batch_size(const char *opt, const char *value, void *target) {
    uint32_t n;
    (void)target;
    if (app_parse_u32(opt, value, &n) < 0)
        return -1;
    fprintf(stderr, "rlx: note: %s has no effect: rlx runs all of a prompt's positions in one pass\n", opt);
    return 0;
}

int app_kv_dtype(const app_options *o) {
    if (o->cache_type_k != o->cache_type_v) {
        app_fail("--cache-type-k %s and --cache-type-v %s differ: rlx keeps K and V in one type",
                 rlx_dtype_name((int)o->cache_type_k), rlx_dtype_name((int)o->cache_type_v));
        return -1;
    }
    return (int)o->cache_type_k;
}

app_opt_group app_common_group(app_options *o) {
    static app_opt opts[16];
    const app_opt model = app_model_group(o).opts[0];
    app_opt list[] = {
        model,
        {0, "plugin", NULL, "NAME", "backend plugin (default cpu-blas; 'ref' = portable reference kernels)",
         APP_OPT_STRING, &o->plugin},
        {0, "plugin-dir", NULL, "DIR", "search DIR for plugins first (also RLX_PLUGIN_PATH)", APP_OPT_STRING,
         &o->plugin_dir},
        {0, "place", NULL, "OP=NAME,..", "run every node of OP (matmul, attention, ...) on backend NAME",
         APP_OPT_STRING, &o->place},
        {0, "backend-opts", NULL, "K=V,..",
         "options of --plugin's backend (e.g. isa=avx2; ref: act=bf16); --place\n"
         "backends get their defaults; launched stages inherit them",
         APP_OPT_STRING, &o->backend_opts},
        {'t', "threads", NULL, "N",
         "threads for the backend (default: all cores; the local stages of a\n"
         "pipeline, and the driver if it drafts, divide the cores evenly)",
         APP_OPT_U32, &o->threads, .min = 1},
        {'c', "ctx-size", "ctx", "N",
         "KV cache positions (default: min(max_position_embeddings, 4096); more than\n"
         "max_position_embeddings runs with a warning: the model was not trained there)",
         APP_OPT_U32, &o->ctx, .min = 1},
        {'v', "verbose", NULL, NULL,
         "say what each backend runs on (kernels, library cores, threads) and\n"
         "let the transport libraries log",
         APP_OPT_FLAG, &o->verbose},
        {0, "quant", NULL, "TYPE",
         "quantize a safetensors model's matrices in memory when loading it, as\n"
         "rlx quantize --type TYPE would (q8_0, q4_0, q4_k_m, ...)",
         APP_OPT_STRING, &o->quant},
        {0, "cache-type-k", NULL, "TYPE",
         "KV cache type (-ctk): f16 (default), f32 (twice the memory) or q8_0\n"
         "(0.53x f16's); rlx keeps K and V in one type, so -ctk alone sets both",
         APP_OPT_CUSTOM, o, .parse = parse_cache_type_k},
        {0, "cache-type-v", NULL, "TYPE", "the same for the values (-ctv; alone it sets both too)", APP_OPT_CUSTOM, o,
         .parse = parse_cache_type_v},
        {0, "check-finite", NULL, NULL,
         "check every node's output as it runs and stop at the first NaN or\n"
         "infinity, naming the node (slow: a debugging aid; launched stages inherit it)",
         APP_OPT_FLAG, &o->check_finite},
        {0, "n-gpu-layers", "gpu-layers", "N", "llama.cpp's -ngl, taken with a warning: rlx has no GPU offload",
         APP_OPT_CUSTOM, NULL, .parse = parse_gpu_layers},
        {0, "flash-attn", NULL, "on|off",
         "llama.cpp's -fa, taken with a note: each backend's attention is one fused\n"
         "op (-fa alone is -fa on, as in llama.cpp's older versions)",
         APP_OPT_CUSTOM, NULL, .parse = parse_flash_attn},
        {'b', "batch-size", NULL, "N", "llama.cpp's, taken with a note: a prompt runs in one pass", APP_OPT_CUSTOM,
         NULL, .parse = parse_batch_size},
        {0, "ubatch-size", NULL, "N", "llama.cpp's -ub, the same", APP_OPT_CUSTOM, NULL, .parse = parse_batch_size},
    };
    memcpy(opts, list, sizeof opts);
    return APP_OPT_GROUP("options:", opts);
}

int app_parse_command(const char *name, const char *usage, const app_opt_group *groups, size_t n_groups, int argc,
                      char **argv, int *exit_status) {
    app_command_spec spec = {.name = name, .usage = usage, .groups = groups, .n_groups = n_groups};
    int rc = app_opts_parse(&spec, argc, argv, 0, NULL);
    *exit_status = rc == 2 ? 0 : rc;
    return rc;
}

void app_warn_threads(uint32_t threads) {
    const uint32_t cores = app_usable_cores();
    if (threads > cores)
        fprintf(stderr,
                "rlx: warning: --threads %u is more than the %u cores this process may use; the threads "
                "will take turns on them, which is slower than --threads %u\n",
                threads, cores, cores);
}

uint32_t app_usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (uint32_t)CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
}

static int is_model_dir(const char *dir) {
    char path[4200];
    return snprintf(path, sizeof path, "%s/config.json", dir) < (int)sizeof path && access(path, R_OK) == 0;
}

int app_resolve_model(app_options *o) {
    static char found[4096];
    if (o->model)
        return 0;
    const char *env = getenv("RLX_MODEL");
    if (env && *env) {
        o->model = env;
        return 0;
    }
    /* an installed rlx finds the copy installed beside bin/; a build tree's uses the source tree's */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        if (snprintf(found, sizeof found, "%s/../share/rlx/models/brown/target", exe) < (int)sizeof found &&
            is_model_dir(found)) {
            o->model = found;
            return 0;
        }
    }
    if (is_model_dir(RLX_SOURCE_DEFAULT_MODEL)) {
        o->model = RLX_SOURCE_DEFAULT_MODEL;
        return 0;
    }
    return app_fail("no --model given, $RLX_MODEL is unset and the Brown model that ships with rlx is missing "
                    "(expected in %s)",
                    RLX_SOURCE_DEFAULT_MODEL);
}
