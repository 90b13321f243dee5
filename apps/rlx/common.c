/* Option parsing and runtime setup shared by the rlx commands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common.h"

const char app_common_help[] =
    "  --model DIR        Hugging Face model directory (config.json, *.safetensors)\n"
    "  --plugin NAME      backend plugin (default cpu-blas; 'ref' = portable reference kernels)\n"
    "  --plugin-dir DIR   search DIR for plugins first (also RLX_PLUGIN_PATH)\n"
    "  --threads N        threads for the backend (default: all cores)\n"
    "  --ctx N            KV cache positions (default: min(max_position_embeddings, 4096))\n";

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

int app_parse_tokens(const char *text, int32_t **out) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return app_fail("out of memory"), -1;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            app_fail("--tokens: '%s' is not a comma-separated list of token ids", text);
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
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        free(ids);
        app_fail("--tokens: no token ids given");
        return -1;
    }
    *out = ids;
    return (int)n;
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
    } else if (strcmp(a, "--threads") == 0) {
        if (!(v = app_value(argc, argv, i)) || app_parse_u32(a, v, &o->threads) < 0)
            return -1;
    } else if (strcmp(a, "--ctx") == 0) {
        if (!(v = app_value(argc, argv, i)) || app_parse_u32(a, v, &o->ctx) < 0)
            return -1;
    } else {
        return 0;
    }
    return 1;
}

int app_runtime_open(app_runtime *rt, const app_options *o) {
    memset(rt, 0, sizeof *rt);
    if (!o->model)
        return app_fail("--model DIR is required");
    const char *plugin = o->plugin ? o->plugin : "cpu-blas";
    if (strcasecmp(plugin, "ref") != 0) {
        if (rlx_registry_create(o->plugin_dir, &rt->registry) != RLX_OK ||
            rlx_registry_load(rt->registry, RLX_PLUGIN_BACKEND, plugin, &rt->plugin) != RLX_OK)
            return app_fail_rlx("cannot load backend"), app_runtime_close(rt), 1;
        rlx_backend_options bo = rlx_backend_options_default();
        bo.n_threads = o->threads;
        if (rlx_backend_create(rt->plugin, &bo, &rt->backend) != RLX_OK)
            return app_fail_rlx("cannot start backend"), app_runtime_close(rt), 1;
    }
    if (rlx_model_open(o->model, &rt->model) != RLX_OK)
        return app_fail_rlx("cannot open model"), app_runtime_close(rt), 1;
    const rlx_model_config *c = rlx_model_config_of(rt->model);
    rlx_block_spec spec = {.layer_start = 0,
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1};
    rlx_session_options so = {.kv_capacity = o->ctx, .backends = &rt->backend, .n_backends = rt->backend ? 1 : 0};
    if (rlx_session_create(rt->model, &spec, &so, &rt->session) != RLX_OK)
        return app_fail_rlx("cannot create session"), app_runtime_close(rt), 1;
    return 0;
}

void app_runtime_close(app_runtime *rt) {
    rlx_session_destroy(rt->session);
    rlx_model_close(rt->model);
    rlx_backend_destroy(rt->backend);
    rlx_plugin_unload(rt->plugin);
    rlx_registry_destroy(rt->registry);
    memset(rt, 0, sizeof *rt);
}
