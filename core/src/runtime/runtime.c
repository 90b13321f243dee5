/* The runtime: assembles the plugins, backends, placement, model, session or pipeline driver
 * and speculator that rlx_runtime_options describe (see rlx/runtime.h), and closes them in the
 * reverse order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "rlx/runtime.h"

#include "util/alloc.h"
#include "util/log.h"
#include "util/sized.h"

struct rlx_runtime {
    rlx_runtime_options o; /* the caller's, read up to its size, defaults past it */
    rlx_registry *registry;
    /* every backend instance, with the plugin it came from (NULL for the built-in reference) */
    rlx_plugin_handle *plugins[RLX_RUNTIME_MAX_BACKENDS];
    rlx_backend *backends[RLX_RUNTIME_MAX_BACKENDS];
    size_t n_backends;
    rlx_backend *preferred[RLX_RUNTIME_MAX_BACKENDS]; /* the preference list's instances, in order */
    size_t n_preferred;
    int main_is_ref; /* the list's first entry is the plain reference kernels */
    rlx_place_rule rules[RLX_OP_COUNT];
    size_t n_rules;
    const rlx_deploy *deploy;
    char *model_dir;
    rlx_model *model;
    rlx_session *session;
    rlx_plugin_handle *transport;
    rlx_driver *driver;
    rlx_lm lm;
    int has_lm;
    rlx_plugin_handle *spec_plugin;
    rlx_speculator *spec;
    char *spec_options; /* draft_model and spec_options joined, as the plugin reads them */
    uint32_t draft_tokens;
};

rlx_runtime_options rlx_runtime_options_default(void) {
    return (rlx_runtime_options){.size = sizeof(rlx_runtime_options)};
}

/* Re-raises the latest failure with `what` in front. */
static rlx_status failed(rlx_status rc, const char *what) {
    const char *detail = rlx_last_error();
    return rlx_error(rc, "%s%s%s", what, *detail ? ": " : "", detail);
}

static rlx_status registry_of(rlx_runtime *rt) {
    rlx_status rc = rt->registry ? RLX_OK : rlx_registry_create(rt->o.plugin_dir, &rt->registry);
    return rc == RLX_OK ? rc : failed(rc, "cannot search for plugins");
}

// ---- backends and placement ----

/* Opens one instance of backend `name`; *out is NULL for the plain reference kernels (the
 * scheduler's fallback needs no instance). */
static rlx_status backend_open(rlx_runtime *rt, const char *name, uint32_t n_threads, const char *options,
                               rlx_backend **out) {
    *out = NULL;
    const int is_ref = strcasecmp(name, "ref") == 0;
    if (is_ref && !(options && *options))
        return RLX_OK;
    if (rt->n_backends == RLX_RUNTIME_MAX_BACKENDS)
        return rlx_error(RLX_E_INVALID, "too many backends (at most %d)", RLX_RUNTIME_MAX_BACKENDS);
    rlx_backend_options bo = rlx_backend_options_default();
    bo.n_threads = n_threads ? n_threads : rt->o.n_threads;
    bo.extra = options;
    rlx_plugin_handle **plugin = &rt->plugins[rt->n_backends];
    rlx_status rc;
    if (is_ref) {
        rc = rlx_backend_create_ref(&bo, out);
    } else {
        if ((rc = registry_of(rt)) != RLX_OK)
            return rc;
        if ((rc = rlx_registry_load(rt->registry, RLX_PLUGIN_BACKEND, name, plugin)) != RLX_OK)
            return failed(rc, "cannot load backend");
        if ((rc = rlx_backend_create(*plugin, &bo, out)) != RLX_OK) {
            rlx_plugin_unload(*plugin);
            *plugin = NULL;
        }
    }
    if (rc != RLX_OK)
        return failed(rc, "cannot start backend");
    rt->backends[rt->n_backends++] = *out;
    rlx__log(RLX_LOG_DEBUG, "backend %s: %s", rlx_backend_name(*out), rlx_backend_describe(*out));
    return RLX_OK;
}

static rlx_status open_preferred(rlx_runtime *rt) {
    static const rlx_runtime_backend fallback = {.name = "cpu-blas"};
    const rlx_runtime_backend *list = rt->o.n_backends ? rt->o.backends : &fallback;
    const size_t n = rt->o.n_backends ? rt->o.n_backends : 1;
    for (size_t i = 0; i < n; i++) {
        if (!list[i].name)
            return rlx_error(RLX_E_INVALID, "backend %zu has no name", i);
        rlx_backend *b;
        rlx_status rc = backend_open(rt, list[i].name, list[i].n_threads, list[i].options, &b);
        if (rc != RLX_OK)
            return rc;
        if (b)
            rt->preferred[rt->n_preferred++] = b;
        else if (i == 0)
            rt->main_is_ref = 1;
    }
    return RLX_OK;
}

/* A placement target: an instance opened already under that name, else a new one with the
 * default options (the options of the list are backend-specific). */
static rlx_status placed_backend(rlx_runtime *rt, const char *name, rlx_backend **out) {
    for (size_t i = 0; i < rt->n_backends; i++)
        if (strcasecmp(rlx_backend_name(rt->backends[i]), name) == 0) {
            *out = rt->backends[i];
            return RLX_OK;
        }
    return backend_open(rt, name, 0, NULL, out);
}

/* "matmul=onednn,attention=cpu-blas"; a later rule for the same op replaces an earlier one. */
static rlx_status parse_place(rlx_runtime *rt) {
    char spec[1024];
    if (snprintf(spec, sizeof spec, "%s", rt->o.place) >= (int)sizeof spec)
        return rlx_error(RLX_E_INVALID, "place: specification too long");
    for (char *save = NULL, *item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        uint32_t op = 0;
        if (eq) {
            *eq = '\0';
            for (uint32_t k = 1; k < RLX_OP_COUNT; k++)
                if (strcasecmp(item, rlx_op_name(k)) == 0)
                    op = k;
        }
        if (!eq || !op || !eq[1])
            return rlx_error(RLX_E_INVALID,
                             "place: '%s' is not OP=BACKEND with OP one of embed, matmul, rms_norm, "
                             "rope, attention, swiglu, add, gather_last, moe",
                             item);
        rlx_backend *b;
        rlx_status rc = placed_backend(rt, eq + 1, &b);
        if (rc != RLX_OK)
            return rc;
        if (!b)
            return rlx_error(RLX_E_INVALID, "place: the reference kernels are the fallback already; name a plugin");
        size_t r = 0;
        while (r < rt->n_rules && rt->rules[r].op != op)
            r++;
        rt->rules[r] = (rlx_place_rule){.op = op, .backend = b};
        rt->n_rules += r == rt->n_rules;
    }
    return RLX_OK;
}

static rlx_status open_backends(rlx_runtime *rt) {
    rlx_status rc = open_preferred(rt);
    if (rc == RLX_OK && rt->o.place && *rt->o.place)
        rc = parse_place(rt);
    return rc;
}

static rlx_session_options session_options(const rlx_runtime *rt) {
    return (rlx_session_options){.size = sizeof(rlx_session_options),
                                 .kv_capacity = rt->o.kv_capacity,
                                 .backends = rt->preferred,
                                 .n_backends = rt->n_preferred,
                                 .rules = rt->rules,
                                 .n_rules = rt->n_rules,
                                 .kv_dtype = rt->o.kv_dtype,
                                 .beyond_trained = (rt->o.flags & RLX_RUNTIME_BEYOND_TRAINED) != 0,
                                 .check_finite = rt->o.check_finite};
}

// ---- speculator ----

typedef struct spec_names {
    char list[1024];
    size_t len;
} spec_names;

static int add_spec_name(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error) {
    (void)path;
    (void)error;
    spec_names *n = ctx;
    if (h && rlx_plugin_desc(h)->kind == RLX_PLUGIN_SPECULATOR && n->len < sizeof n->list)
        n->len += (size_t)snprintf(n->list + n->len, sizeof n->list - n->len, "%s%s", n->len ? ", " : "",
                                   rlx_plugin_desc(h)->name);
    return 0;
}

/* Loads the speculator the options name, or else the deployment file's, and settles its
 * options and draft tokens (the options override the file key by key); none asked for leaves
 * rt->spec_plugin NULL. */
static rlx_status speculator_load(rlx_runtime *rt) {
    const rlx_runtime_options *o = &rt->o;
    const rlx_deploy_speculator *file = rt->deploy ? rlx_deploy_speculator_of(rt->deploy) : NULL;
    const char *name = o->speculator ? o->speculator : file ? file->plugin : NULL;
    if (!name) {
        if (o->draft_tokens || o->draft_model || o->spec_options)
            return rlx_error(RLX_E_INVALID, "draft tokens, a draft model and speculator options need a speculator");
        return RLX_OK;
    }
    const char *draft_model = o->draft_model ? o->draft_model : file ? file->draft_model : NULL;
    const char *options = o->spec_options ? o->spec_options : file ? file->options : NULL;
    rt->draft_tokens = o->draft_tokens              ? o->draft_tokens
                       : file && file->draft_tokens ? file->draft_tokens
                                                    : RLX_RUNTIME_DEFAULT_DRAFT_TOKENS;
    if (rt->draft_tokens > RLX_SPEC_MAX_DRAFT)
        return rlx_error(RLX_E_INVALID, "%s: draft_tokens must be from 1 to %d (got %u)",
                         o->draft_tokens ? "draft tokens" : rlx_deploy_path(rt->deploy), RLX_SPEC_MAX_DRAFT,
                         rt->draft_tokens);
    size_t len = (draft_model ? strlen(draft_model) + 7 : 0) + (options ? strlen(options) + 1 : 0) + 1;
    if (!(rt->spec_options = rlx__malloc(len)))
        return rlx_error(RLX_E_NOMEM, "runtime: out of memory");
    snprintf(rt->spec_options, len, "%s%s%s%s", draft_model ? "model=" : "", draft_model ? draft_model : "",
             draft_model && options && *options ? "," : "", options ? options : "");
    rlx_status rc = registry_of(rt);
    if (rc != RLX_OK)
        return rc;
    if ((rc = rlx_registry_load(rt->registry, RLX_PLUGIN_SPECULATOR, name, &rt->spec_plugin)) != RLX_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", rlx_last_error());
        spec_names names = {.len = 0};
        rlx_registry_each(rt->registry, add_spec_name, &names);
        return rlx_error(rc, "unknown speculator '%s' (available: %s): %s", name, names.len ? names.list : "none", why);
    }
    return RLX_OK;
}

static int speculator_needs_hidden(const rlx_runtime *rt) {
    const rlx_speculator_iface *iface = rt->spec_plugin ? rlx_plugin_desc(rt->spec_plugin)->iface : NULL;
    return iface && (iface->flags & RLX_SPEC_NEEDS_HIDDEN);
}

/* Opens the loaded speculator for the started lm, on the preference list's backends. */
static rlx_status speculator_start(rlx_runtime *rt) {
    rlx_spec_target target = {.size = sizeof target,
                              .kv_capacity = rt->lm.capacity(rt->lm.self),
                              .model_dir = rt->model_dir,
                              .vocab = rt->lm.vocab,
                              .hidden_size = rt->lm.hidden_size,
                              .backends = rt->preferred,
                              .n_backends = rt->n_preferred,
                              .rules = rt->rules,
                              .n_rules = rt->n_rules,
                              .options = rt->spec_options};
    rlx_status rc = rlx_speculator_create(rt->spec_plugin, &target, &rt->spec);
    return rc == RLX_OK ? rc : failed(rc, "cannot start the speculator");
}

// ---- the model: local, or over a pipeline ----

static rlx_status open_local(rlx_runtime *rt) {
    rlx_status rc = open_backends(rt);
    if (rc != RLX_OK)
        return rc;
    if ((rc = rlx_model_open(rt->model_dir, &rt->model)) != RLX_OK)
        return failed(rc, "cannot open model");
    if (rt->o.quant && *rt->o.quant && (rc = rlx_model_quantize(rt->model, rt->o.quant, NULL, NULL)) != RLX_OK)
        return failed(rc, "cannot quantize the model");
    if (rt->o.flags & RLX_RUNTIME_STAGE)
        return RLX_OK;
    const rlx_model_config *c = rlx_model_config_of(rt->model);
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1,
                           .emit_hidden = (uint32_t)speculator_needs_hidden(rt)};
    if (rt->o.progress && (rc = rlx_model_prefetch(rt->model, &spec, rt->o.progress, rt->o.progress_ctx)) != RLX_OK)
        return failed(rc, "cannot read the model");
    rlx_session_options so = session_options(rt);
    if ((rc = rlx_session_create(rt->model, &spec, &so, &rt->session)) != RLX_OK ||
        (rc = rlx_session_lm(rt->session, &rt->lm)) != RLX_OK)
        return failed(rc, "cannot create session");
    rt->has_lm = 1;
    return RLX_OK;
}

/* The stages to drive: the caller's, or the deployment's (*owned then holds them). */
static rlx_status pipeline_stages(rlx_runtime *rt, const rlx_driver_stage **stages, uint32_t *n,
                                  rlx_driver_stage **owned) {
    *owned = NULL;
    if (rt->o.n_stages) {
        *stages = rt->o.stages;
        *n = rt->o.n_stages;
        return RLX_OK;
    }
    rlx_model_config cfg;
    rlx_status rc = rlx_model_config_load_model(rt->model_dir, &cfg);
    if (rc != RLX_OK)
        return failed(rc, "cannot open model");
    *n = rlx_deploy_n_stages(rt->deploy);
    if (!(*owned = rlx__calloc(*n, sizeof **owned)))
        return rlx_error(RLX_E_NOMEM, "runtime: out of memory");
    if ((rc = rlx_deploy_driver_stages(rt->deploy, &cfg, *owned)) != RLX_OK)
        return failed(rc, "pipeline");
    *stages = *owned;
    return RLX_OK;
}

static uint32_t or_default(uint32_t given, uint32_t file) { return given ? given : file; }

/* The caller's credentials, each one it leaves NULL taken from the deployment file. */
static rlx_dist_security driver_security(const rlx_runtime *rt) {
    rlx_dist_security s = rt->o.security, file = {0};
    if (rt->deploy)
        rlx_deploy_security(rt->deploy, -1, &file); /* the driver's: fails only for a stage index */
    const char **mine[] = {&s.tls_ca, &s.tls_cert, &s.tls_key, &s.tls_name, &s.auth_token_file};
    const char *const theirs[] = {file.tls_ca, file.tls_cert, file.tls_key, file.tls_name, file.auth_token_file};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++)
        if (!*mine[i])
            *mine[i] = theirs[i];
    return s;
}

static rlx_status open_pipeline(rlx_runtime *rt) {
    const rlx_runtime_options *o = &rt->o;
    const char *transport = o->transport ? o->transport : rt->deploy ? rlx_deploy_transport(rt->deploy) : "tcp";
    rlx_deploy_timeouts timeouts = {0};
    if (rt->deploy)
        timeouts = *rlx_deploy_timeouts_of(rt->deploy);
    const rlx_driver_stage *stages;
    rlx_driver_stage *owned;
    uint32_t n;
    rlx_status rc = pipeline_stages(rt, &stages, &n, &owned);
    if (rc == RLX_OK && (rc = registry_of(rt)) == RLX_OK &&
        (rc = rlx_registry_load(rt->registry, RLX_PLUGIN_TRANSPORT, transport, &rt->transport)) != RLX_OK)
        rc = failed(rc, "cannot load transport");
    if (rc == RLX_OK) {
        rlx_driver_options d = rlx_driver_options_default();
        d.transport = rt->transport;
        d.stages = stages;
        d.n_stages = n;
        d.kv_capacity = o->kv_capacity;
        d.connect_timeout_ms = or_default(o->connect_timeout_ms, timeouts.connect_ms);
        d.timeout_ms = or_default(o->timeout_ms, timeouts.control_ms);
        d.compute_ms_per_position = or_default(o->compute_ms_per_position, timeouts.per_position_ms);
        d.emit_hidden = (uint32_t)speculator_needs_hidden(rt);
        d.n_slots = o->n_slots;
        d.recovery_timeout_ms = or_default(o->recovery_timeout_ms, timeouts.recovery_ms);
        d.no_recovery = o->no_recovery;
        d.restart = o->stage_restart;
        d.restart_ctx = o->stage_restart_ctx;
        d.security = driver_security(rt);
        if ((rc = rlx_driver_create(rt->model_dir, &d, &rt->driver)) != RLX_OK ||
            (rc = rlx_driver_lm(rt->driver, &rt->lm)) != RLX_OK)
            rc = failed(rc, "pipeline");
    }
    free(owned);
    if (rc != RLX_OK)
        return rc;
    rt->has_lm = 1;
    /* a pipeline's speculator drafts in this process, on the preference list's backends */
    return rt->spec_plugin ? open_backends(rt) : RLX_OK;
}

static rlx_status runtime_start(rlx_runtime *rt) {
    const rlx_runtime_options *o = &rt->o;
    rt->deploy = o->deploy;
    if (rt->deploy && (o->flags & RLX_RUNTIME_STAGE))
        return rlx_error(RLX_E_INVALID, "a stage runtime opens a model directory, not a deployment");
    const char *model = o->model_dir ? o->model_dir : rt->deploy ? rlx_deploy_model(rt->deploy) : NULL;
    if (!model)
        return rt->deploy
                   ? rlx_error(RLX_E_INVALID, "%s names no model and none was given", rlx_deploy_path(rt->deploy))
                   : rlx_error(RLX_E_INVALID, "no model directory given");
    if (!(rt->model_dir = rlx__strdup(model)))
        return rlx_error(RLX_E_NOMEM, "runtime: out of memory");
    rlx_status rc = speculator_load(rt);
    if (rc == RLX_OK)
        rc = rt->deploy || o->n_stages ? open_pipeline(rt) : open_local(rt);
    if (rc == RLX_OK && rt->spec_plugin)
        rc = speculator_start(rt);
    return rc;
}

rlx_status rlx_runtime_open(const rlx_runtime_options *opts, rlx_runtime **out) {
    if (!opts || !out)
        return rlx_error(RLX_E_INVALID, "rlx_runtime_open: NULL argument");
    *out = NULL;
    rlx_runtime *rt = rlx__calloc(1, sizeof *rt);
    if (!rt)
        return rlx_error(RLX_E_NOMEM, "runtime: out of memory");
    rt->o = rlx_runtime_options_default();
    rlx_status rc =
        rlx__read_sized(&rt->o, sizeof rt->o, opts, offsetof(rlx_runtime_options, place), "rlx_runtime_options");
    if (rc == RLX_OK)
        rc = runtime_start(rt);
    if (rc != RLX_OK) {
        rlx_runtime_close(rt);
        return rc;
    }
    *out = rt;
    return RLX_OK;
}

void rlx_runtime_close(rlx_runtime *rt) {
    if (!rt)
        return;
    rlx_speculator_destroy(rt->spec);
    rlx_plugin_unload(rt->spec_plugin);
    free(rt->spec_options);
    rlx_driver_destroy(rt->driver);
    rlx_plugin_unload(rt->transport);
    rlx_session_destroy(rt->session);
    /* backends may hold on to weight pointers until they close, so the model is unmapped last */
    for (size_t i = 0; i < rt->n_backends; i++) {
        rlx_backend_destroy(rt->backends[i]);
        rlx_plugin_unload(rt->plugins[i]);
    }
    rlx_model_close(rt->model);
    rlx_registry_destroy(rt->registry);
    free(rt->model_dir);
    free(rt);
}

// ---- accessors ----

const rlx_lm *rlx_runtime_lm(const rlx_runtime *rt) { return rt->has_lm ? &rt->lm : NULL; }
rlx_session *rlx_runtime_session(const rlx_runtime *rt) { return rt->session; }
const rlx_model *rlx_runtime_model(const rlx_runtime *rt) { return rt->model; }
rlx_driver *rlx_runtime_driver(const rlx_runtime *rt) { return rt->driver; }
const char *rlx_runtime_model_dir(const rlx_runtime *rt) { return rt->model_dir; }
const rlx_deploy *rlx_runtime_deploy(const rlx_runtime *rt) { return rt->deploy; }
size_t rlx_runtime_n_backends(const rlx_runtime *rt) { return rt->n_backends; }
rlx_speculator *rlx_runtime_speculator(const rlx_runtime *rt) { return rt->spec; }
uint32_t rlx_runtime_draft_tokens(const rlx_runtime *rt) { return rt->spec ? rt->draft_tokens : 0; }

const rlx_model_config *rlx_runtime_config(const rlx_runtime *rt) {
    return rt->model ? rlx_model_config_of(rt->model) : rlx_driver_config(rt->driver);
}

rlx_backend *rlx_runtime_backend_at(const rlx_runtime *rt, size_t i) {
    return i < rt->n_backends ? rt->backends[i] : NULL;
}

rlx_backend *rlx_runtime_main_backend(const rlx_runtime *rt) {
    return rt->main_is_ref || !rt->n_preferred ? NULL : rt->preferred[0];
}

const rlx_place_rule *rlx_runtime_rules(const rlx_runtime *rt, size_t *n_rules) {
    *n_rules = rt->n_rules;
    return rt->rules;
}

rlx_status rlx_runtime_serve_stage(rlx_runtime *rt, const char *transport, const rlx_stage_options *so) {
    if (!rt || !so)
        return rlx_error(RLX_E_INVALID, "rlx_runtime_serve_stage: NULL argument");
    if (!(rt->o.flags & RLX_RUNTIME_STAGE))
        return rlx_error(RLX_E_INVALID, "rlx_runtime_serve_stage: the runtime was not opened with RLX_RUNTIME_STAGE");
    rlx_status rc = registry_of(rt);
    if (rc == RLX_OK && !rt->transport &&
        (rc = rlx_registry_load(rt->registry, RLX_PLUGIN_TRANSPORT, transport ? transport : "tcp", &rt->transport)) !=
            RLX_OK)
        return failed(rc, "cannot load transport");
    if (rc != RLX_OK)
        return rc;
    rlx_stage_options s = *so;
    const uint32_t kv_capacity = s.session.kv_capacity;
    s.session = session_options(rt);
    if (kv_capacity)
        s.session.kv_capacity = kv_capacity;
    s.transport = rt->transport;
    rlx_backend *main = rlx_runtime_main_backend(rt);
    s.backend_name = main ? rlx_backend_name(main) : "ref";
    return rlx_stage_serve(rt->model, &s);
}
