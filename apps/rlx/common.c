/* Option parsing and runtime setup shared by the rlx commands. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common.h"

const char app_common_help[] =
    "  --model DIR        Hugging Face model directory (config.json, *.safetensors); default:\n"
    "                     $RLX_MODEL, else the Brown target model shipped with rlx\n"
    "  --plugin NAME      backend plugin (default cpu-blas; 'ref' = portable reference kernels)\n"
    "  --plugin-dir DIR   search DIR for plugins first (also RLX_PLUGIN_PATH)\n"
    "  --place OP=NAME,.. run every node of OP (matmul, attention, ...) on backend NAME\n"
    "  --backend-opts K=V,..  options of --plugin's backend (e.g. isa=avx2; ref: act=bf16); --place\n"
    "                     backends get their defaults; launched stages inherit them\n"
    "  --threads N        threads for the backend (default: all cores; the local stages of a\n"
    "                     pipeline, and the driver if it drafts, divide the cores evenly)\n"
    "  -v, --verbose      say what each backend runs on (kernels, library cores, threads)\n"
    "  --ctx N            KV cache positions (default: min(max_position_embeddings, 4096))\n"
    "pipeline options (run the model over stage processes):\n" APP_PIPELINE_HELP;

int app_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("rlx: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int app_fail_rlx(const char *what) {
    const char *detail = rlx_last_error();
    return app_fail("%s%s%s", what, *detail ? ": " : "", detail);
}

const char *app_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        app_fail("option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
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

int app_parse_max_new(const char *opt, const char *text, uint32_t *out) {
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
    if (errno || end == text || *end) {
        app_fail("%s: '%s' is not a number", opt, text);
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

char *app_read_file(const char *what, const char *path, size_t *len) {
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
    const int failed = ferror(f);
    if (f != stdin)
        fclose(f);
    if (!buf || failed) {
        free(buf);
        app_fail("%s: cannot read %s%s", what, path, failed ? "" : ": out of memory");
        return NULL;
    }
    if (n > 0 && buf[n - 1] == '\n') /* as llama.cpp's -f: a file's last line break is no part of it */
        n--;
    buf[n] = '\0';
    *len = n;
    return buf;
}

int app_parse_common(app_options *o, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    if (strcmp(a, "--model") == 0) {
        if (!(v = app_value(argc, argv, i)))
            return -1;
        o->model = v;
    } else if (strcmp(a, "--plugin") == 0) {
        if (!(v = app_value(argc, argv, i)))
            return -1;
        o->plugin = v;
    } else if (strcmp(a, "--plugin-dir") == 0) {
        if (!(v = app_value(argc, argv, i)))
            return -1;
        o->plugin_dir = v;
    } else if (strcmp(a, "--place") == 0) {
        if (!(v = app_value(argc, argv, i)))
            return -1;
        o->place = v;
    } else if (strcmp(a, "--backend-opts") == 0) {
        if (!(v = app_value(argc, argv, i)))
            return -1;
        o->backend_opts = v;
    } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
        o->verbose = 1;
    } else if (strcmp(a, "--threads") == 0) {
        if (!(v = app_value(argc, argv, i)) || app_parse_u32(a, v, &o->threads) < 0)
            return -1;
    } else if (strcmp(a, "--ctx") == 0) {
        if (!(v = app_value(argc, argv, i)) || app_parse_u32(a, v, &o->ctx) < 0)
            return -1;
    } else {
        return app_pipeline_parse(&o->pipeline, argc, argv, i);
    }
    return 1;
}

uint32_t app_usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (uint32_t)CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
}

int app_backend_open(rlx_registry *reg, const char *name, const rlx_backend_options *bo, const char *what,
                     rlx_plugin_handle **plugin, rlx_backend **out) {
    *plugin = NULL;
    *out = NULL;
    if (strcasecmp(name, "ref") == 0) {
        if (bo->extra && *bo->extra && rlx_backend_create_ref_opts(bo, out) != RLX_OK)
            return app_fail("%scannot start backend: %s", what, rlx_last_error());
        return 0;
    }
    if (rlx_registry_load(reg, RLX_PLUGIN_BACKEND, name, plugin) != RLX_OK)
        return app_fail("%scannot load backend: %s", what, rlx_last_error());
    if (rlx_backend_create(*plugin, bo, out) != RLX_OK) {
        app_fail("%scannot start backend: %s", what, rlx_last_error());
        rlx_plugin_unload(*plugin);
        *plugin = NULL;
        return 1;
    }
    return 0;
}

/* The backend instance of plugin `name`, opened once per runtime ("ref" gives NULL unless it is
 * the main backend with --backend-opts). Only the main backend gets --backend-opts: the options
 * are backend-specific, and --place may name several backends. */
static int backend_named(app_runtime *rt, const app_options *o, const char *name, int main_backend,
                         rlx_backend **out) {
    *out = NULL;
    const char *extra = main_backend ? o->backend_opts : NULL;
    if (strcasecmp(name, "ref") == 0 && !(extra && *extra))
        return 0;
    for (size_t i = 0; i < rt->n_backends; i++)
        if (strcasecmp(rlx_backend_name(rt->backends[i]), name) == 0) {
            *out = rt->backends[i];
            return 0;
        }
    if (rt->n_backends == APP_MAX_BACKENDS)
        return app_fail("too many backends (at most %d)", APP_MAX_BACKENDS);
    if (!rt->registry && rlx_registry_create(o->plugin_dir, &rt->registry) != RLX_OK)
        return app_fail_rlx("cannot search for plugins");
    rlx_backend_options bo = rlx_backend_options_default();
    bo.n_threads = o->threads ? o->threads : rt->default_threads;
    bo.extra = extra;
    if (app_backend_open(rt->registry, name, &bo, "", &rt->plugins[rt->n_backends], &rt->backends[rt->n_backends]))
        return 1;
    *out = rt->backends[rt->n_backends++];
    if (o->verbose)
        fprintf(stderr, "rlx: backend %s: %s\n", rlx_backend_name(*out), rlx_backend_describe(*out));
    return 0;
}

#define PROGRESS_MIN_BYTES ((size_t)256 << 20)

static void show_progress(void *ctx, size_t done, size_t total) {
    (void)ctx;
    int width = 40, filled = total ? (int)((double)done / (double)total * width) : width;
    fprintf(stderr, "\rloading [%.*s%*s] %5.1f%% of %.0f MiB", filled, "========================================",
            width - filled, "", total ? 100.0 * (double)done / (double)total : 100.0, (double)total / 1048576.0);
    fflush(stderr);
}

/* --place matmul=onednn,attention=cpu-blas */
static int parse_place(app_runtime *rt, const app_options *o) {
    char spec[1024];
    if (snprintf(spec, sizeof spec, "%s", o->place) >= (int)sizeof spec)
        return app_fail("--place: specification too long");
    for (char *save = NULL, *item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        int op = 0;
        if (eq) {
            *eq = '\0';
            for (int k = 1; k < RLX_OP_COUNT; k++)
                if (strcasecmp(item, rlx_op_name(k)) == 0)
                    op = k;
        }
        if (!eq || !op || !eq[1])
            return app_fail("--place: '%s' is not OP=BACKEND with OP one of embed, matmul, rms_norm, rope, "
                            "attention, swiglu, add, gather_last, moe", item);
        rlx_backend *b;
        if (backend_named(rt, o, eq + 1, 0, &b))
            return 1;
        if (!b)
            return app_fail("--place: the reference kernels are the fallback already; name a plugin");
        size_t r = 0; /* one rule per op: a later one for the same op replaces it */
        while (r < rt->n_rules && rt->rules[r].op != (uint32_t)op)
            r++;
        rt->rules[r] = (rlx_place_rule){.op = (uint32_t)op, .backend = b};
        rt->n_rules += r == rt->n_rules;
    }
    return 0;
}

/* The whole-model session behind rt->lm, emitting the final hidden states when asked. */
static int create_session(app_runtime *rt, const app_options *o, int emit_hidden) {
    const rlx_model_config *c = rlx_model_config_of(rt->model);
    rlx_block_spec spec = {.layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1,
                           .emit_hidden = (uint32_t)emit_hidden};
    /* the main backend first; --place backends only run the ops they were given */
    rlx_session_options so = {.kv_capacity = o->ctx,
                              .backends = &rt->backend,
                              .n_backends = rt->backend ? 1 : 0,
                              .rules = rt->rules,
                              .n_rules = rt->n_rules};
    if (rlx_session_create(rt->model, &spec, &so, &rt->session) != RLX_OK ||
        rlx_session_lm(rt->session, &rt->lm) != RLX_OK)
        return app_fail_rlx("cannot create session");
    return 0;
}

/* The first half of opening: the deployment file, when running over a pipeline, so that what it
 * configures (the speculator) is known before the model runs. 1 after reporting. */
static int runtime_load(app_runtime *rt, app_options *o) {
    memset(rt, 0, sizeof *rt);
    return app_pipeline_wanted(&o->pipeline) ? app_pipeline_load(rt, &o->pipeline) : 0;
}

/* The second half: the pipeline driver, or the backends, the model and a whole-model session;
 * with emit_hidden the lm provides the final hidden states; drafts says a speculator will run in
 * this process too (launched stages leave it a share of the cores). 1 after reporting; the
 * caller closes rt. */
static int runtime_start(app_runtime *rt, app_options *o, int emit_hidden, int drafts) {
    if (rt->pipeline)
        return app_pipeline_open(rt, o, &o->pipeline, emit_hidden, drafts);
    if (app_resolve_model(o) || backend_named(rt, o, o->plugin ? o->plugin : "cpu-blas", 1, &rt->backend) ||
        (o->place && parse_place(rt, o)))
        return 1;
    if (rlx_model_open(o->model, &rt->model) != RLX_OK)
        return app_fail_rlx("cannot open model"), 1;
    const rlx_model_config *c = rlx_model_config_of(rt->model);
    rlx_block_spec spec = {.layer_start = 0,
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1};
    /* a terminal gets a progress bar while a large model is read in; elsewhere pages fault in lazily */
    if (isatty(STDERR_FILENO) && rlx_weights_total_bytes(rlx_model_weights(rt->model)) >= PROGRESS_MIN_BYTES) {
        rlx_status rc = rlx_model_prefetch(rt->model, &spec, show_progress, NULL);
        fputs("\r\033[K", stderr);
        if (rc != RLX_OK)
            return app_fail_rlx("cannot read the model"), 1;
    }
    if (create_session(rt, o, emit_hidden))
        return 1;
    rt->model_dir = o->model;
    return 0;
}

int app_runtime_open(app_runtime *rt, app_options *o) {
    if (runtime_load(rt, o) || runtime_start(rt, o, 0, 0))
        return app_runtime_close(rt), 1;
    return 0;
}

void app_runtime_close(app_runtime *rt) {
    app_pipeline_close(rt);
    rlx_session_destroy(rt->session);
    /* backends may hold on to weight pointers until they close, so the model is unmapped last */
    for (size_t i = 0; i < rt->n_backends; i++) {
        rlx_backend_destroy(rt->backends[i]);
        rlx_plugin_unload(rt->plugins[i]);
    }
    rlx_model_close(rt->model);
    rlx_registry_destroy(rt->registry);
    memset(rt, 0, sizeof *rt);
}

const char *app_describe_context(const app_runtime *rt, uint32_t capacity, char *buf, size_t size) {
    const rlx_model_config *c = rt->model ? rlx_model_config_of(rt->model) : app_pipeline_config(rt);
    int64_t max_pos = c ? c->max_position_embeddings : 0;
    if (max_pos > 0 && max_pos <= capacity)
        snprintf(buf, size, "%u positions, the model's maximum", capacity);
    else if (max_pos > 0)
        snprintf(buf, size, "%u positions; --ctx raises it up to %lld", capacity, (long long)max_pos);
    else
        snprintf(buf, size, "%u positions; --ctx raises it", capacity);
    return buf;
}

const char app_sampling_help[] =
    "  --greedy           always take the most likely token (the default without sampling options)\n"
    "  --temp T           sampling temperature (> 0)\n"
    "  --top-k K          keep the K most likely tokens (0 = all)\n"
    "  --top-p P          keep the smallest set of tokens whose probability reaches P\n"
    "  --seed S           random seed; the same seed gives the same output\n";

int app_parse_sampling(app_sampling *s, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    if (strcmp(a, "--greedy") == 0) {
        s->greedy = 1;
        return 1;
    }
    if (strcmp(a, "--temp") && strcmp(a, "--top-k") && strcmp(a, "--top-p") && strcmp(a, "--seed"))
        return 0;
    if (!(v = app_value(argc, argv, i)))
        return -1;
    if (strcmp(a, "--seed") == 0) {
        char *end;
        errno = 0;
        unsigned long long seed = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-')
            return app_fail("--seed: '%s' is not a non-negative integer", v), -1;
        s->params.seed = seed;
        s->seeded = 1;
        return 1;
    }
    s->sampling = 1;
    if (strcmp(a, "--top-k") == 0) {
        uint32_t k;
        if (app_parse_u32(a, v, &k) < 0 || k > INT32_MAX)
            return -1;
        s->params.top_k = (int32_t)k;
        return 1;
    }
    return app_parse_float(a, v, strcmp(a, "--temp") == 0 ? &s->params.temperature : &s->params.top_p) < 0 ? -1 : 1;
}

int app_sampling_finish(app_sampling *s) {
    if (s->greedy && s->sampling)
        return app_fail("--greedy cannot be combined with --temp, --top-k or --top-p");
    s->params.greedy = !s->sampling;
    return 0;
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
                    "(expected in %s)", RLX_SOURCE_DEFAULT_MODEL);
}

void app_generation_defaults(const app_runtime *rt, app_sampling *s, uint32_t *max_new, int max_new_given) {
    const rlx_deploy *d = app_pipeline_deploy(rt);
    const rlx_deploy_generation *g = d ? rlx_deploy_generation_of(d) : NULL;
    if (!g)
        return;
    if (!s->sampling && !s->greedy && (g->has_temperature || g->has_top_k || g->has_top_p)) {
        s->params.greedy = 0;
        if (g->has_temperature)
            s->params.temperature = g->temperature;
        if (g->has_top_k)
            s->params.top_k = g->top_k;
        if (g->has_top_p)
            s->params.top_p = g->top_p;
    }
    if (!s->seeded && g->has_seed)
        s->params.seed = g->seed;
    if (!max_new_given && g->has_max_tokens)
        *max_new = g->max_tokens;
}

// ---- speculative decoding ----

const char app_spec_help[] =
    "  --spec NAME        speculative decoding with speculator plugin NAME (draft, ...); the output\n"
    "                     is the same as without it (token for token under greedy)\n"
    "  --draft-tokens K   tokens the speculator proposes per round (default 4, at most 64)\n"
    "  --draft-model DIR  the draft model of --spec draft (its option model=DIR)\n"
    "  --spec-opts OPTS   the speculator's options, \"key=value,key=value\"\n";

int app_parse_spec(app_spec_options *s, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    const char **text = strcmp(a, "--spec") == 0          ? &s->name
                        : strcmp(a, "--draft-model") == 0 ? &s->draft_model
                        : strcmp(a, "--spec-opts") == 0   ? &s->options
                                                          : NULL;
    if (!text && strcmp(a, "--draft-tokens") != 0)
        return 0;
    if (!(v = app_value(argc, argv, i)))
        return -1;
    if (text) {
        *text = v;
        return 1;
    }
    if (app_parse_u32(a, v, &s->draft_tokens) < 0)
        return -1;
    if (s->draft_tokens < 1 || s->draft_tokens > RLX_SPEC_MAX_DRAFT)
        return app_fail("--draft-tokens must be from 1 to %d (got %u)", RLX_SPEC_MAX_DRAFT, s->draft_tokens), -1;
    return 1;
}

typedef struct spec_names {
    char list[1024];
    size_t len;
} spec_names;

static int add_spec_name(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error) {
    spec_names *n = ctx;
    if (h && rlx_plugin_desc(h)->kind == RLX_PLUGIN_SPECULATOR && n->len < sizeof n->list)
        n->len += (size_t)snprintf(n->list + n->len, sizeof n->list - n->len, "%s%s", n->len ? ", " : "",
                                   rlx_plugin_desc(h)->name);
    return 0;
}

/* Loads the plugin of the speculator the command line names, or else the deployment file's, and
 * settles its options and draft tokens; out->plugin stays NULL when none was asked for. */
static int speculator_load(app_runtime *rt, const app_options *o, const app_spec_options *so, app_speculator *out) {
    memset(out, 0, sizeof *out);
    const rlx_deploy *d = app_pipeline_deploy(rt);
    const rlx_deploy_speculator *file = d ? rlx_deploy_speculator_of(d) : NULL;
    const char *name = so->name ? so->name : file ? file->plugin : NULL;
    if (!name) {
        if (so->draft_tokens || so->draft_model || so->options)
            return app_fail("--draft-tokens, --draft-model and --spec-opts need --spec NAME");
        return 0;
    }
    /* the command line overrides the file key by key, as for generation defaults */
    const char *draft_model = so->draft_model ? so->draft_model : file ? file->draft_model : NULL;
    const char *options = so->options ? so->options : file ? file->options : NULL;
    out->k = so->draft_tokens              ? so->draft_tokens
             : file && file->draft_tokens ? file->draft_tokens
                                          : APP_DEFAULT_DRAFT_TOKENS;
    if (out->k > RLX_SPEC_MAX_DRAFT)
        return app_fail("%s: draft_tokens must be from 1 to %d (got %u)", rlx_deploy_path(d), RLX_SPEC_MAX_DRAFT,
                        out->k);
    size_t len = (draft_model ? strlen(draft_model) + 7 : 0) + (options ? strlen(options) + 1 : 0) + 1;
    if (!(out->options = malloc(len)))
        return app_fail("out of memory");
    snprintf(out->options, len, "%s%s%s%s", draft_model ? "model=" : "", draft_model ? draft_model : "",
             draft_model && options && *options ? "," : "", options ? options : "");
    if (!rt->registry && rlx_registry_create(o->plugin_dir, &rt->registry) != RLX_OK)
        return app_fail_rlx("cannot search for plugins");
    if (rlx_registry_load(rt->registry, RLX_PLUGIN_SPECULATOR, name, &out->plugin) != RLX_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", rlx_last_error());
        spec_names names = {.len = 0};
        rlx_registry_each(rt->registry, add_spec_name, &names);
        return app_fail("unknown speculator '%s' (available: %s): %s", name, names.len ? names.list : "none", why);
    }
    return 0;
}

/* Opens the loaded speculator for rt's started model. */
static int speculator_start(app_runtime *rt, const app_options *o, app_speculator *s) {
    /* a pipeline driver drafts in this process, on --plugin's backend */
    if (rt->pipeline && !rt->backend && backend_named(rt, o, o->plugin ? o->plugin : "cpu-blas", 1, &rt->backend))
        return 1;
    rlx_spec_target target = {.size = sizeof target,
                              .kv_capacity = rt->lm.capacity(rt->lm.self),
                              .model_dir = rt->model_dir,
                              .vocab = rt->lm.vocab,
                              .hidden_size = rt->lm.hidden_size,
                              .backends = &rt->backend,
                              .n_backends = rt->backend ? 1 : 0,
                              .rules = rt->rules,
                              .n_rules = rt->n_rules,
                              .options = s->options};
    if (rlx_speculator_create(s->plugin, &target, &s->spec) != RLX_OK)
        return app_fail_rlx("cannot start the speculator");
    return 0;
}

int app_runtime_open_speculative(app_runtime *rt, app_options *o, const app_spec_options *so, app_speculator *spec) {
    if (runtime_load(rt, o))
        return app_runtime_close(rt), 1;
    if (speculator_load(rt, o, so, spec))
        return app_speculator_close(spec), app_runtime_close(rt), 1;
    const rlx_speculator_iface *iface = spec->plugin ? rlx_plugin_desc(spec->plugin)->iface : NULL;
    if (runtime_start(rt, o, iface && (iface->flags & RLX_SPEC_NEEDS_HIDDEN), spec->plugin != NULL))
        return app_speculator_close(spec), app_runtime_close(rt), 1;
    if (spec->plugin && speculator_start(rt, o, spec))
        return app_speculator_close(spec), app_runtime_close(rt), 1;
    return 0;
}

void app_speculator_close(app_speculator *s) {
    rlx_speculator_destroy(s->spec);
    rlx_plugin_unload(s->plugin);
    free(s->options);
    memset(s, 0, sizeof *s);
}
