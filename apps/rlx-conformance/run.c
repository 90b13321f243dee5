/* The worker side of the kit: loads the backend, runs one check and judges it. An op check
 * asks supports() at planning time (data pointers NULL, as the scheduler does), then runs the
 * node and checks, in order: the returned status, that nothing was written past the output or
 * into an input, that the whole output was written, that it is finite, that ATTENTION wrote
 * the cache rows, and the largest difference from the expectation. The recurrent ops run as
 * several calls over one state, checked after each (judge_calls). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

#define KEEP_BUDGET ((size_t)512 << 20)

void kit_runner_on_phase(kit_runner *r, void (*fn)(void *ctx, const char *phase), void *ctx) {
    r->phase = fn;
    r->phase_ctx = ctx;
}

int kit_open_tested(kit_runner *r, rlx_backend **out) {
    rlx_backend_options bo = rlx_backend_options_default();
    bo.n_threads = r->o->threads;
    bo.extra = r->o->backend_opts;
    return r->o->builtin_ref ? rlx_backend_create_ref(&bo, out) : rlx_backend_create(r->plugin, &bo, out);
}

typedef struct failed_files {
    char text[2048];
    size_t len;
} failed_files;

static int collect_failures(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error) {
    failed_files *f = ctx;
    if (!h && f->len < sizeof f->text)
        f->len += (size_t)snprintf(f->text + f->len, sizeof f->text - f->len, "\n    %s", error);
    return 0;
}

int kit_runner_open(const kit_options *o, kit_runner **out, char *why, size_t why_len) {
    *out = NULL;
    kit_runner *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    r->o = o;
    if (!o->builtin_ref) {
        if (rlx_registry_create(o->plugin_dir, &r->registry) != RLX_OK) {
            snprintf(why, why_len, "cannot search for plugins: %s", rlx_last_error());
            goto fail;
        }
        if (rlx_registry_load(r->registry, RLX_PLUGIN_BACKEND, o->plugin, &r->plugin) != RLX_OK) {
            char first[1024];
            snprintf(first, sizeof first, "%s", rlx_last_error());
            /* A plugin built for another ABI is skipped by the name search; say so. */
            failed_files f = {.len = 0};
            if (!strchr(o->plugin, '/'))
                rlx_registry_each(r->registry, collect_failures, &f);
            snprintf(why, why_len, "cannot load backend plugin '%s': %s%s%s", o->plugin, first,
                     f.len ? "\n  plugin files that failed to load:" : "", f.text);
            goto fail;
        }
    }
    if (kit_open_tested(r, &r->tested) != RLX_OK) {
        snprintf(why, why_len, "backend plugin '%s' (%s) failed to open: %s", o->plugin,
                 r->plugin ? rlx_plugin_path(r->plugin) : "built in", rlx_last_error());
        goto fail;
    }
    rlx_backend_options emulate = rlx_backend_options_default();
    emulate.extra = "act=bf16";
    if (rlx_backend_create_ref(NULL, &r->ref) != RLX_OK || rlx_backend_create_ref(&emulate, &r->ref_bf16) != RLX_OK) {
        snprintf(why, why_len, "cannot open the reference kernels: %s", rlx_last_error());
        goto fail;
    }
    if (r->plugin) {
        const rlx_plugin *d = rlx_plugin_desc(r->plugin);
        snprintf(r->describe, sizeof r->describe, "backend '%s' %s (%s), built for ABI %u.%u; this rlx has ABI %d.%d",
                 d->name, d->version, rlx_plugin_path(r->plugin), d->abi_major, d->abi_minor, RLX_ABI_MAJOR,
                 RLX_ABI_MINOR);
    } else {
        snprintf(r->describe, sizeof r->describe, "the reference kernels built into librlx (ABI %d.%d)", RLX_ABI_MAJOR,
                 RLX_ABI_MINOR);
    }
    *out = r;
    return 0;
fail:
    kit_runner_close(r);
    return -1;
}

static void free_kept(kit_runner *r) {
    for (size_t i = 0; i < r->n_kept; i++)
        free(r->kept[i]);
    r->n_kept = 0;
    r->kept_bytes = 0;
}

void kit_runner_close(kit_runner *r) {
    if (!r)
        return;
    rlx_backend_destroy(r->tested);
    rlx_backend_destroy(r->ref);
    rlx_backend_destroy(r->ref_bf16);
    free_kept(r);
    free(r->kept);
    rlx_plugin_unload(r->plugin);
    rlx_registry_destroy(r->registry);
    free(r);
}

const char *kit_runner_describe(const kit_runner *r) { return r->describe; }

/* Takes the weights of node into the kept list; past the budget, reopens the tested backend
 * so they can be freed. */
static void keep_weights(kit_runner *r, kit_node *n) {
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        if (!n->is_weight[i] || !n->in[i].data)
            continue;
        if (r->n_kept == r->cap_kept) {
            size_t cap = r->cap_kept ? r->cap_kept * 2 : 64;
            void **k = realloc(r->kept, cap * sizeof *k);
            if (!k)
                continue; /* freed with the node: harmless unless the backend caches by pointer */
            r->kept = k;
            r->cap_kept = cap;
        }
        r->kept[r->n_kept++] = n->in[i].data;
        r->kept_bytes += rlx_iface_tensor_bytes(&n->in[i]);
        n->in[i].data = NULL;
    }
    if (r->kept_bytes > KEEP_BUDGET && !r->o->builtin_ref) {
        rlx_backend_destroy(r->tested);
        r->tested = NULL;
        free_kept(r);
        if (kit_open_tested(r, &r->tested) != RLX_OK)
            r->tested = NULL; /* the next check reports it */
    }
}

static void run_op(kit_runner *r, const kit_check *c, kit_result *res) {
    kit_node n;
    char why[512];
    int rc =
        c->source == KIT_SRC_REF ? kit_ref_node(c, &n, 0) : kit_fixture_read(c->path, &n, NULL, 0, 1, why, sizeof why);
    if (rc < 0) {
        result(res, KIT_FAIL, "kit: cannot build the case: %s", c->source == KIT_SRC_REF ? "out of memory" : why);
        return;
    }
    rlx_tensor *plan, plan_out;
    rlx_node_view v;
    if (!(plan = kit_planning_view(&n, n.in, c->name, &plan_out, &v))) {
        kit_node_free(&n);
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    phase(r, "supports()");
    int claimed = rlx_backend_supports(r->tested, &v);
    const uint32_t prec = claimed ? rlx_backend_precision(r->tested, &v) : RLX_PRECISION_F32;
    free(plan);
    if (!claimed) {
        kit_node_free(&n);
        result(res, KIT_NOT_CLAIMED, "%s", "");
        return;
    }
    if (c->source == KIT_SRC_REF) {
        kit_node_free(&n);
        if (kit_ref_node(c, &n, 1) < 0) {
            kit_node_free(&n);
            result(res, KIT_FAIL, "kit: out of memory");
            return;
        }
    }
    if (kit_ref_invariance(c))
        kit_judge_invariance(r, c, &n, res);
    else if (n.n_calls)
        kit_judge_calls(r, c, &n, res);
    else
        kit_judge(r, c, &n, prec, res);
    phase(r, "close() and open(), to release the weights it has seen");
    keep_weights(r, &n);
    kit_node_free(&n);
}

void kit_run_check(kit_runner *r, const kit_check *c, kit_result *res) {
    memset(res, 0, sizeof *res);
    res->err = -1;
    if (!r->tested) {
        result(res, KIT_FAIL, "backend failed to reopen: %s", rlx_last_error());
        return;
    }
    if (c->source == KIT_SRC_MODEL && c->spec == KIT_MODEL_SPANS) {
        kit_run_model_spans(r, c, res);
    } else if (c->source == KIT_SRC_MODEL) {
        kit_run_model(r, c, res);
    } else if (c->source == KIT_SRC_NUMPY && !c->path) {
        result(res, KIT_FAIL,
               "no NumPy expectation files (*.rlxcase) found; build rlx with python3-numpy installed, "
               "pass --data DIR, or skip this part with --no-numpy");
    } else {
        run_op(r, c, res);
    }
}
